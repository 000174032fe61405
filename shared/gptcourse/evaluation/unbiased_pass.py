"""pass@k: the chance that at least one of k samples solves a problem, estimated without bias from n >= k samples
of which c are correct (Chen et al. 2021, the HumanEval paper): 1 - C(n - c, k) / C(n, k).

The naive 1 - (1 - c/n)^k, the chance for k independent draws *with* replacement, is biased low: drawing k of
the n samples without replacement, a problem with c correct ones is solved whenever n - c < k. The binomials
overflow floats for large n; their ratio is the product of (1 - k / i) for i from n - c + 1 to n.
"""

from __future__ import annotations

import math


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with c correct samples out of n."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:  # every draw of k samples holds a correct one
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))
