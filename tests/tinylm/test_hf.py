"""transformers as the independent reference: `LlamaForCausalLM.from_pretrained("data/tinylm")` gives TinyLM's
logits and greedy text on the course's prompts, and so do TinyLM on TP=2 ranks and the paged serving engine;
`AutoTokenizer` gives ByteTokenizer's ids. transformers is imported once for the module (~5-10 s)."""
import pytest
import torch

from labkit.parallel import Pool, tensor_parallel_generate
from labkit.paths import TINYLM_CHECKPOINT
from labkit.serving import Engine, SamplingParams
from labkit.serving.workload import make_trace
from labkit.tinylm import ByteTokenizer, TinyLM, load_pretrained
from labkit.tinylm.checkpoint import save_pretrained

transformers = pytest.importorskip("transformers")

LOGIT_TOLERANCE = 2e-4  # max |logit difference| (logits ~10): 4.5e-5 to 5.7e-5 measured, another summation order
NEAR_TIE = 1e-3         # greedy paths may part only where TinyLM's top two logits are closer than this
NEWLINE = 10


@pytest.fixture(scope="module")
def hf():
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    return transformers.LlamaForCausalLM.from_pretrained(TINYLM_CHECKPOINT).eval()


@pytest.fixture(scope="module")
def hf_tokenizer():
    return transformers.AutoTokenizer.from_pretrained(TINYLM_CHECKPOINT)


@pytest.fixture(scope="module")
def tinylm() -> TinyLM:
    return load_pretrained()[0]


@pytest.fixture(scope="module")
def prompts() -> list[tuple[list[int], int]]:
    """(prompt ids, tokens to generate): the course's serving trace (tasks of every kind and plain text)."""
    return [(list(r.prompt), min(r.max_tokens, 24)) for r in make_trace(10, float("inf"), seed=0, long_tail=0.0)]


def hf_greedy(hf, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False)
    return out[0, len(prompt):].tolist()


def until_newline(ids: list[int]) -> list[int]:
    return ids[:ids.index(NEWLINE) + 1] if NEWLINE in ids else ids


def assert_same_greedy(got: list[int], want: list[int], tinylm: TinyLM, prompt: list[int]) -> None:
    """got == want, or they part where TinyLM's top two logits nearly tie (either choice is greedy)."""
    got, want = until_newline(got), until_newline(want)
    n = min(len(got), len(want))
    first = next((i for i in range(n) if got[i] != want[i]), None)
    if first is None:
        assert len(got) == len(want) or NEWLINE not in got + want, (got, want)
        return
    with torch.no_grad():
        top2 = tinylm(torch.tensor([prompt + want[:first]]))[0, -1].topk(2).values
    assert top2[0] - top2[1] < NEAR_TIE, f"greedy paths part at token {first} away from a tie: {got} vs {want}"


def test_transformers_reads_the_release_as_a_llama(hf, tinylm):
    assert type(hf.model.layers[0].mlp.act_fn).__name__ == "SiLUActivation"
    assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()  # tied
    assert hf.config.rope_parameters["rope_theta"] == tinylm.cfg.rope_theta
    assert hf.config.rms_norm_eps == tinylm.cfg.norm_eps and hf.config.eos_token_id == NEWLINE
    assert sum(p.numel() for p in hf.parameters()) == sum(p.numel() for p in tinylm.parameters())


def test_logits_equal_transformers_on_the_course_prompts(hf, tinylm, prompts):
    worst = 0.0
    with torch.no_grad():
        for prompt, _ in prompts:
            ids = torch.tensor([prompt])
            worst = max(worst, (tinylm(ids) - hf(ids).logits).abs().max().item())
        shortest = min(len(p) for p, _ in prompts)
        batch = torch.tensor([p[-shortest:] for p, _ in prompts])  # and the prompts' ends as one batch
        worst = max(worst, (tinylm(batch) - hf(batch).logits).abs().max().item())
    assert worst < LOGIT_TOLERANCE


def test_greedy_text_equals_transformers(hf, tinylm, prompts):
    for prompt, n in prompts:
        assert_same_greedy(tinylm.generate(prompt, n, stop_token=NEWLINE), hf_greedy(hf, prompt, n), tinylm, prompt)


@pytest.mark.timeout(120)
def test_tp2_and_the_paged_engine_generate_what_transformers_does(hf, tinylm, prompts):
    want = [hf_greedy(hf, p, n) for p, n in prompts]
    with Pool(2, timeout=20) as pool:
        for (prompt, n), w in list(zip(prompts, want))[:4]:
            assert_same_greedy(tensor_parallel_generate(tinylm, prompt, n, 2, pool=pool)["tokens"], w, tinylm, prompt)
    params = [SamplingParams(max_tokens=n, temperature=0.0, stop_token_ids=(NEWLINE,)) for _, n in prompts]
    outputs = Engine(tinylm, block_size=16).generate([p for p, _ in prompts], params)
    for (prompt, _), got, w in zip(prompts, outputs, want):
        assert_same_greedy(list(got), w, tinylm, prompt)


def test_a_release_written_by_transformers_loads_in_labkit(hf, tinylm, tmp_path):
    hf.save_pretrained(tmp_path / "hf")
    again, _ = load_pretrained(tmp_path / "hf")
    for k, v in tinylm.state_dict().items():
        assert torch.equal(again.state_dict()[k], v), k
    save_pretrained(again, tmp_path / "labkit")
    back = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "labkit")
    for k, v in hf.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k


def test_auto_tokenizer_gives_byte_ids(hf_tokenizer):
    tok = ByteTokenizer()
    texts = ["The old sailor", "83+58=", "copy wrntd9tsei4v95 -> ", "naïve café", "日本語 🙂 ΚΑΛΗ",
             " two  spaces\tand\ttabs\n\nnewlines ", "Ċ Ġ <0x0A> <s> </s> [UNK]", "".join(map(chr, range(128)))]
    for text in texts:
        assert hf_tokenizer(text)["input_ids"] == tok.encode(text), text
        assert hf_tokenizer.decode(tok.encode(text)) == text, text
    for b in range(256):  # every byte: one token, its value, decoded as ByteTokenizer decodes it
        assert hf_tokenizer.convert_ids_to_tokens(b) == hf_tokenizer.convert_ids_to_tokens([b])[0]
        assert hf_tokenizer.decode([b]) == tok.decode([b]), b
    invalid = [97, 0xFF, 98, 0xE6, 0x97, 99, 0xC0, 0xAF, 0xF0, 0x9F]  # not UTF-8: U+FFFD as Python's "replace"
    assert hf_tokenizer.decode(invalid) == tok.decode(invalid)
    assert len(hf_tokenizer) == 256 and hf_tokenizer.all_special_ids == []
