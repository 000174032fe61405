"""Evaluation (lesson 14): `loglikelihood` against each request run alone and against lm-evaluation-harness's
HFLM on the same model exported with `to_hf`; acc, acc_norm and acc_bytes against the harness's own task on the
same items; `pass_at_k` against the HumanEval paper's numpy estimator and exact binomials; the error bars against
the harness's stderr, a closed form and their coverage by simulation; `ngram_overlap` against a slow string
search. Nothing is downloaded: the harness runs on local objects."""

from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from gptcourse import (
    GPT,
    CharTokenizer,
    GPTConfig,
    MultipleChoiceItem,
    addition_items,
    addition_text,
    bootstrap_interval,
    count_correct,
    encode_pair,
    few_shot_context,
    generate,
    loglikelihood,
    multiple_choice_accuracy,
    ngram_overlap,
    normalize_answer,
    paired_bootstrap,
    pass_at_k,
    score_choices,
    standard_error,
)
from gptcourse.evaluation.contamination import words

TEXT = addition_text(50) + "éü→ abcxyz.\n"  # a few non-ASCII characters, for acc_bytes
TOKENIZER = CharTokenizer(TEXT)
CONFIG = GPTConfig(vocab_size=TOKENIZER.vocab_size, context_length=16, d_model=32, n_heads=4, n_layers=2,
                   mlp="gelu_tanh")  # GPT-2's layout, so `to_hf` gives a GPT2LMHeadModel
# (context, continuation) token ids: a one-token continuation, a prefix of another, and one truncated on the left
REQUESTS = [([3, 5, 7], [2]), ([3, 5, 7], [2, 9, 4]), ([1], [6, 6]), (list(range(1, 15)), [8, 2, 3, 4, 5])]


def _model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(CONFIG).eval()
    with torch.no_grad():  # larger weights than at initialisation: peaked distributions, greedy paths that differ
        for p in model.parameters():
            p.mul_(3.0)
    return model


def _alone(model: GPT, context: list[int], continuation: list[int]) -> tuple[float, bool]:
    """One request, unbatched and unpadded: the slow obvious way."""
    whole = (context + continuation)[-(CONFIG.context_length + 1):]
    with torch.no_grad():
        logprobs = F.log_softmax(model(torch.tensor([whole[:-1]]))[0], dim=-1)  # (T, V)
    rows = logprobs[len(whole) - 1 - len(continuation):]  # the positions that predict the continuation
    target = torch.tensor(continuation)
    return float(rows.gather(-1, target[:, None]).sum()), bool(torch.equal(rows.argmax(-1), target))


def test_loglikelihood_equals_each_request_alone():
    model = _model()
    got, greedy = loglikelihood(model, [c for c, _ in REQUESTS], [x for _, x in REQUESTS], batch_size=3)
    for i, (context, continuation) in enumerate(REQUESTS):
        want, want_greedy = _alone(model, context, continuation)
        assert float(got[i]) == pytest.approx(want, abs=1e-5)
        assert bool(greedy[i]) == want_greedy


def test_greedy_flag_is_true_for_the_argmax_path_and_false_off_it():
    model = _model()
    context = [3, 5, 7]
    path = generate(model, torch.tensor([context]), 3, temperature=0)[0, 3:].tolist()  # greedy decoding's tokens
    off = (path[0] + 1) % CONFIG.vocab_size  # not the argmax; the two tokens after it are, given it
    detour = [off, *generate(model, torch.tensor([[*context, off]]), 2, temperature=0)[0, 4:].tolist()]
    _, greedy = loglikelihood(model, [context, context], [path, detour])
    assert greedy.tolist() == [True, False]


def test_loglikelihood_rejects_what_it_cannot_score():
    model = _model()
    with pytest.raises(ValueError, match="at least one token"):
        loglikelihood(model, [[]], [[1]])
    with pytest.raises(ValueError, match="does not fit"):
        loglikelihood(model, [[1]], [[2] * 17])


def _hf_tokenizer():
    """The course's character tokenizer as a Hugging Face fast tokenizer (a BPE without merges: one token per
    character, the same ids), built here: nothing is downloaded."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: i for i, ch in enumerate(TOKENIZER.chars)}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE(vocab=vocab, merges=[])),
                                   eos_token="\n")


@pytest.fixture(scope="module")
def harness():
    """lm-evaluation-harness's HFLM on our model exported with `to_hf`, and the model."""
    pytest.importorskip("lm_eval")
    from lm_eval.models.huggingface import HFLM

    model = _model(1)
    lm = HFLM(pretrained=model.to_hf().eval(), tokenizer=_hf_tokenizer(), backend="causal",
              max_length=CONFIG.context_length, batch_size=4, device="cpu")
    return lm, model


def _requests(pairs):
    from lm_eval.api.instance import Instance

    return [Instance(request_type="loglikelihood", doc={}, arguments=pair, idx=i) for i, pair in enumerate(pairs)]


def test_loglikelihood_equals_the_harness(harness):
    lm, model = harness
    pairs = [("3+4=", " 7"), ("3+4=", " 71"), ("12+30=", " 42"), ("1", "+1= 2\n"), ("é", "ü→ ab"),
             ("49+49= 98\n" * 2, "0+0= 0")]  # the last is truncated on the left
    want = lm.loglikelihood(_requests(pairs), disable_tqdm=True)
    encoded = [encode_pair(TOKENIZER, c, x) for c, x in pairs]
    got, greedy = loglikelihood(model, [c for c, _ in encoded], [x for _, x in encoded])
    assert got.tolist() == pytest.approx([ll for ll, _ in want], abs=1e-5)
    assert greedy.tolist() == [g for _, g in want]


def _harness_task(items):
    """The harness's own multiple-choice task over `items` (a local dataset, built in memory)."""
    import datasets
    from lm_eval.api.task import ConfigurableTask

    docs = [{"question": it.question, "choices": list(it.choices), "answer": it.answer} for it in items]
    return ConfigurableTask(config={
        "task": "course_items", "custom_dataset": lambda **_: {"test": datasets.Dataset.from_list(docs)},
        "test_split": "test", "output_type": "multiple_choice", "doc_to_text": "{{question}}",
        "doc_to_choice": "{{choices}}", "doc_to_target": "{{answer}}",
        "metric_list": [{"metric": "acc"}, {"metric": "acc_norm"}, {"metric": "acc_bytes"}]}), docs


def _mixed_items(count: int) -> list[MultipleChoiceItem]:
    """Items whose choices differ in characters, bytes and tokens (one a prefix of another), so that acc, acc_norm
    and acc_bytes pick differently on some of them."""
    r = random.Random(0)
    pool = ["7", "71", "é", "ü→", "ab", "→→→", "a", "xyz", "éü", "12+3", "abcxyz"]
    return [MultipleChoiceItem(f"{r.randint(0, 9)}+{r.randint(0, 9)}=", tuple(r.sample(pool, 4)), r.randint(0, 3))
            for _ in range(count)]


ITEMS = [*addition_items(12, seed=3), MultipleChoiceItem("1+1=", ("2", "22", "222"), 0), *_mixed_items(40)]


def test_acc_and_acc_norm_equal_the_harness(harness):
    lm, model = harness
    task, docs = _harness_task(ITEMS)
    want = {"acc": [], "acc_norm": [], "acc_bytes": []}
    for doc in docs:
        requests = task.construct_requests(doc, task.doc_to_text(doc))
        results = lm.loglikelihood(requests, disable_tqdm=True)
        for metric, value in task.process_results(doc, results).items():
            want[metric].append(value)
    for metric, normalize in (("acc", None), ("acc_norm", "chars"), ("acc_bytes", "bytes")):
        assert multiple_choice_accuracy(model, TOKENIZER, ITEMS, normalize).tolist() == want[metric], metric
    assert want["acc"] != want["acc_norm"] != want["acc_bytes"]  # the items tell the three apart


def test_standard_error_equals_the_harness_and_the_closed_form():
    pytest.importorskip("lm_eval")
    from lm_eval.api.metrics import mean_stderr

    scores = [float(x) for x in torch.randint(0, 2, (57,), generator=torch.Generator().manual_seed(0))]
    p, n = sum(scores) / len(scores), len(scores)
    assert standard_error(scores) == pytest.approx(mean_stderr(scores), rel=1e-12)
    assert standard_error(scores) == pytest.approx(math.sqrt(p * (1 - p) / (n - 1)), rel=1e-12)  # 0/1 scores


def test_score_choices_normalises_by_the_choice_not_the_delimiter():
    model, context, choices = _model(), "12+3=", ["15", "150", "5"]
    raw = score_choices(model, TOKENIZER, context, choices)
    pairs = [encode_pair(TOKENIZER, context, " " + c) for c in choices]
    assert raw.tolist() == pytest.approx(loglikelihood(model, *map(list, zip(*pairs, strict=True)))[0].tolist())
    for normalize, lengths in (("chars", [2, 3, 1]), ("bytes", [2, 3, 1]), ("tokens", [3, 4, 2])):
        got = score_choices(model, TOKENIZER, context, choices, normalize)
        assert got.tolist() == pytest.approx((raw / torch.tensor(lengths, dtype=raw.dtype)).tolist())
    with pytest.raises(ValueError, match="normalize must be one of"):
        score_choices(model, TOKENIZER, context, choices, "words")


def test_encode_pair_moves_the_context_s_trailing_spaces_to_the_continuation():
    assert encode_pair(TOKENIZER, "3+4= ", "7") == (TOKENIZER.encode("3+4="), TOKENIZER.encode(" 7"))


def test_few_shot_context_puts_solved_items_before_the_question():
    shots = [MultipleChoiceItem("1+1=", ("3", "2"), 1), MultipleChoiceItem("2+2=", ("4", "5"), 0)]
    item = MultipleChoiceItem("3+3=", ("6", "7"), 0)
    assert few_shot_context(item, shots) == "1+1= 2\n\n2+2= 4\n\n3+3="
    assert few_shot_context(item) == "3+3="


def test_ties_go_to_the_first_choice():
    model = _model()
    item = MultipleChoiceItem("3+4=", ("7", "7", "8"), 1)  # choices 0 and 1 score the same: 0 is chosen
    assert multiple_choice_accuracy(model, TOKENIZER, [item]).tolist() == [0.0]


def _humaneval_numpy(n: int, c: int, k: int) -> float:
    """The HumanEval paper's numerically stable estimator (Chen et al. 2021, figure 3), in numpy."""
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def test_pass_at_k_equals_the_humaneval_estimator_for_n_up_to_200():
    for n in range(1, 201):
        for k in sorted({1, 2, 5, 10, n // 2, n} & set(range(1, n + 1))):
            for c in range(n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(_humaneval_numpy(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_equals_the_exact_binomials():
    for n in range(1, 25):
        for k in range(1, n + 1):
            for c in range(n + 1):
                exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
                assert pass_at_k(n, c, k) == pytest.approx(float(exact), abs=1e-12)


def test_pass_at_k_is_unbiased_where_the_naive_formula_is_not():
    assert pass_at_k(10, 3, 10) == 1.0 and 1 - (1 - 3 / 10) ** 10 < 0.98  # n = k: any correct sample is drawn
    assert pass_at_k(10, 0, 5) == 0.0 and pass_at_k(10, 10, 1) == 1.0
    # unbiased: averaged over every draw of k of the n samples, the fraction of draws holding a correct one
    n, c, k = 8, 3, 3
    draws = list(itertools.combinations(range(n), k))
    assert pass_at_k(n, c, k) == pytest.approx(sum(any(i < c for i in s) for s in draws) / len(draws))
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(5, 2, 6)


def test_bootstrap_interval_covers_the_true_accuracy_about_95_percent_of_the_time():
    """1,000 simulated evaluation sets of 100 items, each answered right with p = 0.7."""
    gen = torch.Generator().manual_seed(0)
    draws = (torch.rand(1000, 100, generator=gen) < 0.7).double()
    covered = [low <= 0.7 <= high for low, high in
               (bootstrap_interval(d, resamples=400, seed=i) for i, d in enumerate(draws))]
    assert 0.92 <= sum(covered) / len(covered) <= 0.975


def test_paired_bootstrap_covers_the_true_difference_and_is_narrower_than_unpaired():
    gen = torch.Generator().manual_seed(1)
    easy = torch.rand(1000, 200, generator=gen)  # each item's difficulty, shared by both models
    a, b = (easy < 0.75).double(), (easy < 0.70).double()  # b is right on a subset of a's items: true gap 0.05
    results = [paired_bootstrap(x, y, resamples=400, seed=i) for i, (x, y) in enumerate(zip(a, b, strict=True))]
    covered = sum(r.low <= 0.05 <= r.high for r in results) / len(results)
    assert 0.92 <= covered <= 0.975
    first = results[0]
    unpaired = 1.96 * math.hypot(standard_error(a[0]), standard_error(b[0]))
    assert first.high - first.low < unpaired  # pairing cancels the items both get right or wrong
    same = paired_bootstrap(a[0], a[0])
    assert (same.difference, same.significant) == (0.0, False)


def _slow_overlap(train_text: str, item: str, n: int) -> float:
    """String search for each n-gram, words joined by single spaces: the obvious way."""
    haystack = " " + " ".join(words(train_text)) + " "
    tokens = words(item)
    grams = [" " + " ".join(tokens[i : i + n]) + " " for i in range(len(tokens) - n + 1)]
    return sum(g in haystack for g in grams) / len(grams) if grams else 0.0


def test_ngram_overlap_equals_a_slow_string_search():
    r = random.Random(0)
    vocab = ["a", "b", "c", "d"]  # few words: many overlapping n-grams, some absent
    train = " ".join(r.choice(vocab) for _ in range(300))
    items = [" ".join(r.choice(vocab) for _ in range(r.randint(2, 20))) for _ in range(40)]
    for n in (1, 3, 6):
        assert ngram_overlap(train, items, n) == pytest.approx([_slow_overlap(train, it, n) for it in items])


def test_a_planted_item_is_found_through_case_and_punctuation():
    planted = "The quick brown fox jumps over the lazy dog while thirteen words are counted here today"
    train = "Some text. " + planted.upper().replace(" ", ", ") + "! More text."
    clean = "An item that the training text never saw, written for this test, has none of its n-grams there"
    assert ngram_overlap(train, [planted, clean, "too short"]) == [1.0, 0.0, 0.0]


def test_count_correct_verifies_normalised_answers():
    """A model whose head always says "a": every sample is "aaa" (three new tokens, no stop)."""
    config = CONFIG.replace(tie_weights=False, lm_head_bias=True)
    model = GPT(config).eval()
    with torch.no_grad():
        model.lm_head.weight.zero_()
        model.lm_head.bias.copy_(-100 + 200 * F.one_hot(torch.tensor(TOKENIZER.stoi["a"]), config.vocab_size))
    got = count_correct(model, TOKENIZER, ["1+1=", "2+2="], [" AAA.", "aa"], n=4, temperature=1.0, max_new_tokens=3)
    assert got == [4, 0]
    assert normalize_answer("  Forty  Two. ") == "forty two"
