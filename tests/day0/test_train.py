"""labkit.day0.train: the decoder starts as TinyLM, QK-norm starts at the measured RMS, the loss sees answers only."""
import torch

from labkit.day0 import TinyVLMConfig, small_config
from labkit.day0.train import _image_batches, from_tinylm, train
from labkit.tinylm import ByteTokenizer, TinyLM, TinyLMConfig


def test_from_tinylm_copies_the_decoder_and_calibrates_qk_norm():
    torch.manual_seed(1)
    src = TinyLM(TinyLMConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=64)).eval()
    cfg = small_config()
    tokens = torch.randint(0, 256, (2, 10))
    vlm = from_tinylm(src, cfg, tokens)
    lm = vlm.language_model
    assert torch.equal(lm.tok_emb.weight[:256], src.tok_emb.weight)
    assert torch.equal(lm.layers[1].mlp.w_down.weight, src.layers[1].mlp.w_down.weight)
    x = src.layers[0].attn_norm(src.tok_emb(tokens))  # layer 0's input, computed by hand
    q = src.layers[0].attn.wq(x).view(2, 10, 4, 8)
    expected = q.pow(2).mean(-1).sqrt().mean()
    assert torch.allclose(lm.layers[0].attn.q_norm.weight, expected.expand(8), rtol=1e-5)


def test_the_image_loss_covers_the_answer_and_its_newline_only():
    cfg = small_config()
    pixels, tokens, mask = _image_batches(cfg, 32, seed=0)  # 8 per question kind
    assert pixels.dtype == torch.uint8 and pixels.shape == (32, 3, 32, 32)
    tok = ByteTokenizer()
    for row, m in zip(tokens, mask):
        targets = row[1:][m[:-1]].tolist()  # the tokens the masked positions predict
        n = cfg.tokens_per_image
        assert row[:n].tolist() == [cfg.image_token_id] * n
        question = tok.decode(row[n:].tolist()).split("=")[0] + "="
        answer = tok.decode(targets)
        assert answer.endswith("\n") and question in ("colour=", "shape=", "count=", "digit=") and "=" not in answer


def test_a_few_steps_run_and_return_an_eval_model():
    model = train(steps=2, image_pool=30, train_bytes=20_000, text_batch=2, image_batch=4)
    assert not model.training and isinstance(model.config, TinyVLMConfig)
