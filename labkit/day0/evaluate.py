"""How good TinyVLM is (notebook 07, the model card and the Day-0 report): exact-match accuracy on image
questions, and TinyLM's own text measures on its decoder."""

from __future__ import annotations

import torch

from .._checks import check_positive_int, check_type, fail
from ..tinylm import ByteTokenizer, corpus, perplexity, task_accuracy
from .config import TinyVLMConfig
from .images import QUESTION_KINDS, ImageTask, make_image_tasks, to_pixels

N_IMAGE_TASKS = 200   # per question kind, test split
N_TEXT_TASKS = 200    # per TinyLM task kind, test split
VAL_BYTES = 65_536


def task_tokens(cfg: TinyVLMConfig, question: str, n_images: int = 1) -> list[int]:
    """The prompt the model was trained on: the image placeholders, then the question's bytes."""
    check_type("question", question, str, "a question such as 'colour='")
    check_positive_int("n_images", n_images, allow_zero=True)
    return [cfg.image_token_id] * (cfg.tokens_per_image * n_images) + ByteTokenizer().encode(question)


@torch.no_grad()
def image_task_correct(model, tasks: list[ImageTask], batch_size: int = 64) -> list[bool]:
    """For each task: does greedy decoding give exactly the answer and then "\\n"? One teacher-forced forward
    per batch, as labkit.tinylm.eval.task_correct does for text (greedy yields the answer iff every answer
    position's argmax is the next answer token)."""
    if not isinstance(tasks, list) or not tasks or not all(isinstance(t, ImageTask) for t in tasks):
        fail("tasks", type(tasks).__name__, "a non-empty list of labkit.day0.ImageTask", TypeError)
    check_positive_int("batch_size", batch_size)
    cfg, tok, correct = model.config, ByteTokenizer(), []
    for i in range(0, len(tasks), batch_size):
        group = tasks[i:i + batch_size]
        seqs = [(task_tokens(cfg, t.question), tok.encode(t.answer + "\n")) for t in group]
        longest = max(len(p) + len(a) for p, a in seqs) - 1
        batch = torch.zeros(len(group), longest, dtype=torch.long)  # right padding: causal, so harmless
        for j, (p, a) in enumerate(seqs):
            batch[j, :len(p) + len(a) - 1] = torch.tensor((p + a)[:-1])
        pred = model(batch, pixels=to_pixels([t.image for t in group])).argmax(-1)
        correct += [pred[j, len(p) - 1:len(p) - 1 + len(a)].tolist() == a for j, (p, a) in enumerate(seqs)]
    return correct


def image_accuracy(model, n: int = N_IMAGE_TASKS, split: str = "test", seed: int = 0) -> dict[str, float]:
    """Exact-match accuracy (0..1) per question kind on `n` fresh images each."""
    out = {}
    for kind in QUESTION_KINDS:
        ok = image_task_correct(model, make_image_tasks(kind, n, split, seed))
        out[kind] = sum(ok) / len(ok)
    return out


def text_quality(language_model, n: int = N_TEXT_TASKS, seed: int = 0) -> dict:
    """TinyLM's model-card measures for a decoder: validation perplexity and test accuracy per task kind."""
    tasks = [t for kind in corpus.TASK_KINDS for t in corpus.make_tasks(kind, n, "test", seed)]
    return {"val_perplexity": perplexity(language_model, corpus.corpus("val", VAL_BYTES, seed)),
            "accuracy": task_accuracy(language_model, tasks)}
