"""The new task and the fine-tuning loop: answers are right, the splits never share a word, batches mask exactly
the answer, a few steps of LoRA lower the loss on a small model, and bad input is refused."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.finetune import memory, train
from labkit.tinylm import ByteTokenizer, TinyLM, TinyLMConfig, corpus
from tests.refusals import assert_refused


def test_first_tasks_are_right_and_the_splits_are_disjoint():
    words = {}
    for split in corpus.SPLITS:
        tasks = corpus.make_new_tasks("first", 300, split, seed=3)
        for t in tasks:
            word = t.prompt.removeprefix("first ").removesuffix(" -> ")
            assert t.kind == "first" and t.answer == word[0] and 3 <= len(word) <= 10 and word.isalpha()
            assert corpus.word_split(word) == split
        words[split] = {t.prompt for t in tasks}
    assert not (words["train"] & words["test"]) and not (words["train"] & words["val"])
    assert corpus.make_new_tasks("first", 5) == corpus.make_new_tasks("first", 5)
    assert_refused(lambda: corpus.make_new_tasks("upper", 5), ValueError, "kind", "upper", "one of")


def test_task_batch_masks_the_answer_and_its_newline():
    tasks = corpus.make_new_tasks("first", 4, "train")
    tokens, mask = train.task_batch(tasks)
    tok = ByteTokenizer()
    for i, t in enumerate(tasks):
        targets = tokens[i, 1:][mask[i]].tolist()
        assert tok.decode(targets) == t.answer + "\n"


def test_a_few_lora_steps_lower_the_loss_and_full_trains_everything():
    torch.manual_seed(0)
    model = TinyLM(TinyLMConfig(d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=64, max_seq_len=32))
    tasks = corpus.make_new_tasks("first", 64, "train")
    lora = train.make_model(model, "lora", rank=4)
    run = train.fine_tune(lora, tasks, steps=15, batch_size=8, lr=1e-2)
    assert run.losses[-1] < run.losses[0] and run.trainable < sum(p.numel() for p in model.parameters()) // 3
    full = train.make_model(model, "full")
    assert train.fine_tune(full, tasks, steps=1, batch_size=2).trainable == sum(p.numel() for p in model.parameters())
    assert_refused(lambda: train.make_model(model, "dora"), ValueError, "method", "dora", "one of")
    assert_refused(lambda: train.fine_tune(lora, tasks, steps=0), ValueError, "steps", 0, "positive")


def test_training_tasks_mix_in_the_old_tasks_at_the_share_asked():
    assert train.training_tasks(n=40) == corpus.make_new_tasks("first", 40, "train")
    tasks = train.training_tasks(n=60, replay=0.5, seed=2)
    kinds = [t.kind for t in tasks]
    assert kinds.count("first") == 60 and len(tasks) == 120
    assert all(kinds.count(k) == 20 for k in ("arithmetic", "recall", "copy"))
    assert ({t.prompt for t in tasks if t.kind == "copy"}
            <= {t.prompt for t in corpus.make_tasks("copy", 20, "train", 2)})
    for bad in (1.0, -0.1, float("nan")):
        assert_refused(lambda: train.training_tasks(replay=bad), ValueError, "replay", bad, "[0, 1)")


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=24))
def test_length_groups_split_where_the_padded_tokens_are_fewest(lengths):
    groups = train.length_groups(lengths)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths))) and 1 <= len(groups) <= 2
    assert all(g for g in groups)
    assert len(groups) == 1 or max(lengths[i] for i in groups[0]) <= min(lengths[i] for i in groups[1])

    def padded(parts):
        return sum(len(p) * max(lengths[i] for i in p) for p in parts)
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    best = min(padded([order[:c], order[c:]] if c < len(order) else [order])
               for c in range(1, len(order) + 1))
    assert padded(groups) == best  # brute force over every cut of the sorted batch


def test_grouped_gradients_are_the_padded_batchs():
    torch.manual_seed(0)
    model = TinyLM(TinyLMConfig(d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=64, max_seq_len=256)).double()
    for p in model.parameters():
        p.requires_grad_(True)
    tasks = train.training_tasks(n=12, replay=0.5, seed=1)[::2]  # short "first" lines and long recall ones
    assert len(train.length_groups([len(t.prompt) + len(t.answer) + 1 for t in tasks])) == 2
    loss = train.accumulate_gradients(model, tasks)
    grouped = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    tokens, mask = train.task_batch(tasks)
    padded = memory.lm_loss(model, tokens, mask)
    padded.backward()
    assert abs(loss - padded.item()) < 1e-12
    assert all(torch.allclose(g, p.grad, rtol=1e-10, atol=1e-13) for g, p in zip(grouped, model.parameters()))
    for bad in ([], [3, 0], [2.5], "16"):
        assert_refused(lambda: train.length_groups(bad), ValueError, "lengths", bad, "positive ints")
    assert_refused(lambda: train.accumulate_gradients(model, []), ValueError, "tasks", [], "non-empty list")
    with pytest.raises(TypeError, match="model must be a TinyLM .*, got str"):
        train.accumulate_gradients("model", tasks)
