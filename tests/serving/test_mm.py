"""Image features through the engine (labkit.serving.mm, lab 07) on a small random TinyLM with random "image"
features: every request's greedy output equals the model's own full forward with those features written over
the placeholders (TinyLM.forward(embeds=...), no cache: an independent path), for every policy, chunked prefill
splitting images, preemption by recompute and by swap, and over two gloo ranks; the image hash keeps two images
with the same placeholders apart in the prefix cache, and the naive cache (hash_mm=False) answers from the
first image; text-only steps call the model exactly as lab 06 did; bad inputs are refused by name."""
import pickle

import pytest
import torch

from labkit.parallel import Pool
from labkit.serving import Engine, SamplingParams, StepCost
from labkit.serving.mm import MultiModalInput, check_mm, step_embeds
from labkit.serving.scheduler import Scheduled
from labkit.serving.sequence import Sequence
from labkit.serving.tp import TPRunner
from labkit.tinylm import TinyLM, TinyLMConfig
from tests.refusals import assert_refused

CFG = TinyLMConfig(vocab_size=64, d_model=16, n_layers=2, n_heads=2, n_kv_heads=2, d_ff=32, max_seq_len=96)
IMG = 63  # the placeholder token
GREEDY = SamplingParams(max_tokens=8, temperature=0)


@pytest.fixture(scope="module")
def lm():
    """Random weights of std 0.3 (not TinyLM's 0.02 init, whose greedy output repeats the last token whatever
    came before): each image's answer then differs."""
    torch.manual_seed(0)
    model = TinyLM(CFG).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
    return model


def image(seed: int, offset: int, length: int = 6) -> MultiModalInput:
    g = torch.Generator().manual_seed(seed)
    return MultiModalInput(offset, length, f"image-{seed}", 3 * torch.randn(length, CFG.d_model, generator=g))


def with_images(text: list[int], *seeds: int, length: int = 6) -> tuple[list[int], tuple[MultiModalInput, ...]]:
    """A prompt: each image's placeholders followed by token 0, then `text`."""
    tokens, mm = [], []
    for s in seeds:
        mm.append(image(s, len(tokens), length))
        tokens += [IMG] * length + [0]
    return tokens + text, tuple(mm)


@torch.no_grad()
def reference(model, prompt, mm, n=GREEDY.max_tokens) -> list[int]:
    """Greedy tokens from full forwards with the features written over the placeholders (no KV cache)."""
    embeds = (torch.cat([torch.arange(m.offset, m.end) for m in mm]), torch.cat([m.embeds for m in mm])) if mm else None
    out = []
    for _ in range(n):
        out.append(int(model(torch.tensor([prompt + out]), embeds=embeds)[0, -1].argmax()))
    return out


REQUESTS = [with_images([1, 2, 3], 1), with_images([1, 2, 3], 2), with_images([4, 5], 1, 3), with_images([7], 3),
            with_images([1, 2, 3], 1), ([8, 9, 10, 11, 12], ()), with_images([2] * 9, 2, 4, length=9)]


@pytest.fixture(scope="module")
def alone(lm):
    return [reference(lm, p, mm) for p, mm in REQUESTS]


def run(engine, requests=REQUESTS):
    ids = [engine.add_request(p, GREEDY, mm=mm) for p, mm in requests]
    engine.run_until_done()
    return [engine.get(i).output for i in ids]


@pytest.mark.parametrize("policy, preemption, num_blocks, budget", [
    ("static", "recompute", None, None), ("continuous", "recompute", None, None), ("chunked", "recompute", None, 5),
    ("chunked", "recompute", 10, 4), ("continuous", "swap", 10, None), ("chunked", "swap", 10, 7),
    ("continuous", "recompute", 10, None), ("static", "swap", 10, None)])
def test_each_image_request_gets_the_answer_of_its_own_forward(lm, alone, policy, preemption, num_blocks, budget):
    engine = Engine(lm, policy=policy, preemption=preemption, num_blocks=num_blocks, block_size=4, max_num_seqs=4,
                    max_num_batched_tokens=budget, clock=StepCost())
    assert run(engine) == alone
    assert engine.block_manager.num_used_blocks == 0 and engine.runner.host == {}
    if num_blocks:
        assert engine.stats()["preemptions"] > 0  # the small pool did force preemption (features fed again)
    if budget is not None and budget < 6:
        chunks = [n for h in engine.history for rid, n in h["batch"] if rid == "req-0"]
        assert len(chunks) > GREEDY.max_tokens  # the 10-token prompt (a 6-token image) took several chunks


def test_images_are_cached_by_their_hash_and_the_naive_cache_answers_from_the_first_image(lm, alone):
    (pa, _), (pb, _) = REQUESTS[0], REQUESTS[1]  # the same tokens, two images
    assert pa == pb and alone[0] != alone[1]
    for hash_mm in (True, False):
        engine = Engine(lm, block_size=4, clock=StepCost(), hash_mm=hash_mm)
        [first], [second], [again] = (run(engine, [REQUESTS[i]]) for i in (0, 1, 0))
        assert first == again == alone[0]
        if hash_mm:
            assert second == alone[1] and engine.stats()["prefix_cache_hits"] == 8  # only the repeat hit
        else:
            assert second == alone[0] != alone[1]  # image 2's answer came from image 1's keys and values
            assert engine.stats()["prefix_cache_hits"] == 16


def test_a_prefix_hit_that_ends_inside_an_image_feeds_the_rest_of_it(lm, alone):
    engine = Engine(lm, block_size=4, clock=StepCost())
    assert run(engine, [REQUESTS[0]]) == [alone[0]]
    assert run(engine, [REQUESTS[2]]) == [alone[2]]  # block 0 (image 1's first 4 rows) hit, rows 4, 5 fed
    assert engine.stats()["prefix_cache_hits"] == 4


def test_a_chunk_gets_only_the_feature_rows_of_its_own_positions():
    prompt, mm = with_images([1, 2], 1, 2, length=3)  # images at 0..2 and 4..6
    a = Sequence("a", prompt, GREEDY, mm=mm)
    b = Sequence("b", [5, 6, 7], GREEDY)
    rows, values = step_embeds([Scheduled(b, 0, 3), Scheduled(a, 2, 4)])  # a's positions 2..5 packed at 3..6
    assert rows.tolist() == [3, 5, 6]  # position 2 (image 1, row 2) and 4, 5 (image 2, rows 0, 1)
    assert torch.equal(values, torch.cat([mm[0].embeds[2:], mm[1].embeds[:2]]))
    assert step_embeds([Scheduled(b, 0, 3), Scheduled(a, 7, 1)]) is None  # text only: no embeds at all


class NoEmbeds(TinyLM):
    """A model whose forward has lab 06's signature (no embeds argument): what text-only engines must keep."""

    def forward(self, tokens, cache=None):
        return super().forward(tokens, cache)


def test_text_steps_call_the_model_as_before_and_image_steps_pass_embeds(lm):
    plain = NoEmbeds(CFG).eval()
    plain.load_state_dict(lm.state_dict())
    assert Engine(plain, clock=StepCost()).generate([[1, 2, 3]], GREEDY) == [reference(lm, [1, 2, 3], ())]
    engine = Engine(plain, clock=StepCost())
    prompt, mm = REQUESTS[0]
    engine.add_request(prompt, GREEDY, mm=mm)
    with pytest.raises(TypeError, match="embeds"):
        engine.step()


def test_a_step_with_images_pickles_for_the_tensor_parallel_ranks(lm):
    engine = Engine(lm, clock=StepCost())
    prompt, mm = REQUESTS[2]
    engine.add_request(prompt, GREEDY, mm=mm)
    step = engine._step_input(engine.scheduler.schedule(engine.now))
    back = pickle.loads(pickle.dumps(step))
    assert step.embeds is not None and all(torch.equal(x, y) for x, y in zip(step.embeds, back.embeds))


@pytest.mark.timeout(120)
def test_image_requests_over_two_ranks_equal_their_own_forward(lm, alone):
    with Pool(2, timeout=30) as pool:
        runner = TPRunner(lm, 2, num_blocks=64, block_size=4, pool=pool)
        engine = Engine(runner=runner, policy="chunked", max_num_batched_tokens=8, max_num_seqs=4, block_size=4,
                        num_blocks=64, clock=StepCost())
        assert run(engine) == alone
        runner.close()


@pytest.mark.parametrize("kwargs, error, name, value, expected", [
    (dict(offset=-1), ValueError, "offset", -1, "an int >= 0"),
    (dict(length=0), ValueError, "length", 0, "a positive int"),
    (dict(hash=""), TypeError, "hash", "", "a non-empty str"),
    (dict(embeds=[[0.0] * 4]), TypeError, "embeds", [[0.0] * 4], "a torch.Tensor"),
    (dict(embeds=torch.zeros(2, 4, dtype=torch.long)), TypeError, "embeds", "dtype torch.int64", "floating-point"),
    (dict(embeds=torch.zeros(3, 4)), ValueError, "embeds", "shape (3, 4)", "[2, d_model]"),
])
def test_a_bad_image_input_is_refused_by_name(kwargs, error, name, value, expected):
    args = {"offset": 0, "length": 2, "hash": "h", "embeds": torch.zeros(2, 4), **kwargs}
    assert_refused(lambda: MultiModalInput(**args), error, name, value, expected)


def test_bad_images_are_refused_at_admission_and_nothing_is_queued(lm):
    engine = Engine(lm, clock=StepCost())
    prompt, (one, two) = with_images([1], 1, 2, length=3)
    moved = MultiModalInput(2, 3, "x", torch.zeros(3, CFG.d_model))
    cases = [
        ((prompt[:5], (one, two)), ValueError, "mm[1]", "positions [4, 7)", "inside the prompt's 5 tokens"),
        ((prompt, (one, moved)), ValueError, "mm[1]", "positions [2, 5)", "does not overlap mm[0] [0, 3)"),
        ((prompt, (MultiModalInput(0, 3, "x", torch.zeros(3, 8)),)), ValueError, "mm[0].embeds", "shape (3, 8)",
         "[3, 16] (the model's d_model)"),
        ((prompt, (one, "image")), TypeError, "mm[1]", "str", "a labkit.serving.MultiModalInput"),
        ((prompt, one), TypeError, "mm", "MultiModalInput", "a sequence of"),
    ]
    for (p, mm), error, name, value, expected in cases:
        assert_refused(lambda: engine.add_request(p, GREEDY, mm=mm), error, name, value, expected)
    assert engine.requests == {} and not engine.has_unfinished()
    assert check_mm((two, one), len(prompt), CFG.d_model) == (one, two)  # sorted by offset
