"""The shared attention-and-heads mistakes (grading/attention_mistakes.py): the by-hand attention is right without
a switch (against torch's scaled_dot_product_attention), each row of the catalogue gives another answer, and a
piece's rows are computed only for a wrong answer, in order, until one matches."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch
from torch.nn import functional as F

from gptcourse.checks import CheckFailed
from gptcourse.grading.attention_mistakes import ROWS, TILED_KV_HEADS, attend_by_hand, kv_heads_by_hand
from gptcourse.grading.piece import Piece
from gptcourse.grading.student import module_returns, returns


def _qkv(t_q: int = 3, t_k: int = 7, h: int = 4, h_kv: int = 2, d: int = 8) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(2, h, t_q, d, generator=gen), torch.randn(2, h_kv, t_k, d, generator=gen),
            torch.randn(2, h_kv, t_k, d, generator=gen))


@pytest.mark.parametrize(("t_q", "t_k"), [(5, 5), (3, 7), (1, 6)])
def test_attend_by_hand_is_torchs_attention_of_the_last_queries(t_q, t_k):
    q, k, v = _qkv(t_q, t_k)
    allowed = torch.ones(t_q, t_k, dtype=torch.bool).tril(diagonal=t_k - t_q)  # the queries are the last t_q
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=True)
    torch.testing.assert_close(attend_by_hand(q, k, v)[0], want)


def test_kv_heads_by_hand_serves_consecutive_query_heads():
    x = torch.arange(2.0).view(1, 2, 1, 1)  # kv heads 0 and 1
    assert kv_heads_by_hand(x, 3).flatten().tolist() == [0, 0, 0, 1, 1, 1]
    assert kv_heads_by_hand(x, 3, tiled=True).flatten().tolist() == [0, 1, 0, 1, 0, 1]


def test_each_row_of_the_catalogue_gives_another_answer():
    q, k, v = _qkv(4, 4)  # T_q = T_k, so that k q^T (the swapped row) has the shape of q k^T
    right = attend_by_hand(q, k, v)[0]
    outputs = {why: attend_by_hand(q, k, v, **switches)[0] for why, switches in ROWS.items()}
    same = [why for why, out in outputs.items() if torch.allclose(out, right)]
    top_left = attend_by_hand(*_qkv(2, 5), top_left=True)[0]  # with T_q = T_k top-left is bottom-right
    assert same == [next(why for why, switches in ROWS.items() if switches == {"top_left": True})]
    assert not torch.allclose(top_left, attend_by_hand(*_qkv(2, 5))[0])


def test_a_pieces_rows_are_computed_only_for_a_wrong_answer_until_one_matches():
    called = []

    def by_hand(x, n_rep, **switches):
        called.append(switches)
        return kv_heads_by_hand(x, n_rep, **switches)

    rows = {"first, never matching": {"tiled": False}, TILED_KV_HEADS: {"tiled": True}, "after": {"tiled": True}}
    piece = Piece("99", "repeat_kv", kv_heads_by_hand, returns("y", lambda i: "repeat_kv", "x", "n_rep"),
                  visible=[("visible", "repeat_kv", lambda seed: {"x": torch.randn(1, 2, 3, 4), "n_rep": 2})],
                  mistakes=rows, by_hand=by_hand)
    case = piece.cases[0]
    inputs = case.inputs(0)
    case.judge(case.call(kv_heads_by_hand, inputs), case.expected(inputs), inputs)
    assert called == []
    with pytest.raises(CheckFailed, match="the kv heads are tiled"):
        case.judge(case.call(lambda x, n: x.repeat(1, n, 1, 1), inputs), case.expected(inputs), inputs)
    assert called == [{"tiled": False}, {"tiled": True}]


def test_rows_without_a_by_hand_are_refused():
    with pytest.raises(ValueError, match="need by_hand"):
        Piece("99", "p", None, returns("y", lambda i: "p", "x"), visible=[], mistakes={"why": {}})


class _Gain(torch.nn.Module):
    """y = g * x, written by hand: `doubled`, the mistake, gives 2 g x."""

    built: ClassVar[list[bool]] = []  # the `doubled` of each one built

    def __init__(self, width: int, *, doubled: bool = False) -> None:
        super().__init__()
        self.g, self.doubled = torch.nn.Parameter(torch.ones(width)), doubled
        _Gain.built.append(doubled)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.g * x * (2 if self.doubled else 1)


def test_a_class_by_hand_is_built_with_its_switches_from_rows_that_depend_on_the_case():
    piece = Piece("99", "Gain", _Gain, module_returns("y", lambda i: "Gain"),
                  visible=[("visible", "Gain", lambda seed: {"init": {"width": 3}, "weights": {"g": torch.arange(3.0)},
                                                              "x": torch.ones(2, 3)})],
                  mistakes=lambda i: {f"g x doubled ({i['init']['width']} wide)": {"doubled": True}}, by_hand=_Gain)
    case = piece.cases[0]
    inputs = case.inputs(0)
    expected = case.expected(inputs)
    _Gain.built.clear()
    case.judge(expected, expected, inputs)
    assert _Gain.built == []  # a right answer builds no mistake
    with pytest.raises(CheckFailed, match=r"g x doubled \(3 wide\)"):
        case.judge({"y": 2 * expected["y"]}, expected, inputs)
    assert _Gain.built == [True]
