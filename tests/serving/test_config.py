"""EngineConfig: checked once, resolved against the model and the runner's pool; the engine, tp_engine and the
command line all take their defaults from it."""
import pytest
from hypothesis import given, strategies as st

from labkit.kv_cache import blocks_needed
from labkit.serving import EngineConfig, StepCost
from labkit.serving.__main__ import parse_args
from labkit.tinylm import TinyLMConfig
from tests.refusals import assert_refused

CFG = TinyLMConfig()


def test_defaults_resolve_to_a_pool_for_max_num_seqs_full_contexts():
    c = EngineConfig().resolve(CFG)
    assert c.resolved and c.block_size == 16
    assert c.num_blocks == 32 * blocks_needed(CFG.max_seq_len, 16)
    assert c.max_num_batched_tokens == max(CFG.max_seq_len, 32)
    assert EngineConfig(policy="chunked").resolve(CFG).max_num_batched_tokens == 64
    assert not EngineConfig().resolved


@given(st.integers(1, 4096), st.sampled_from([1, 2, 4, 8, 16, 32, 64]), st.integers(1, 64))
def test_a_runners_pool_is_taken_as_it_is(num_blocks, block_size, seqs):
    c = EngineConfig(max_num_seqs=seqs).resolve(CFG, pool=(num_blocks, block_size))
    assert (c.num_blocks, c.block_size) == (num_blocks, block_size)
    asked = EngineConfig(max_num_seqs=seqs, num_blocks=num_blocks, block_size=block_size)
    assert asked.resolve(CFG, pool=(num_blocks, block_size)) == c  # the same pool asked for explicitly: accepted
    assert asked.resolve(CFG) == c  # and without a runner, the engine allocates exactly that


@pytest.mark.parametrize("field, value, error, expected", [
    ("block_size", 12, ValueError, "a positive power of two"),
    ("num_blocks", 0, ValueError, "a positive int"),
    ("max_num_seqs", 1.5, TypeError, "a positive int"),
    ("max_num_batched_tokens", -1, ValueError, "a positive int"),
    ("policy", "fifo", ValueError, "one of"),
    ("preemption", "drop", ValueError, "one of"),
    ("max_wait", -2.0, ValueError, "positive"),
    ("max_num_batched_tokens", 4, ValueError, ">= max_num_seqs (32)"),
    ("enable_prefix_caching", 1, TypeError, "True or False"),
    ("clock", "cpu", ValueError, '"wall", "measured" or a StepCost'),
    ("history_limit", 0, ValueError, "a positive int"),
])
def test_bad_fields_are_refused_by_name(field, value, error, expected):
    assert_refused(lambda: EngineConfig(**{field: value}), error, field, value, expected)


def test_unknown_options_are_refused_with_the_known_ones():
    assert_refused(lambda: EngineConfig.build(num_block=3), TypeError, "option", "num_block",
                   "one of EngineConfig's fields: block_size, num_blocks")
    base = EngineConfig(max_num_seqs=4, clock=StepCost())
    assert EngineConfig.build(base, policy="static") == EngineConfig(max_num_seqs=4, clock=StepCost(), policy="static")


def test_the_command_lines_defaults_are_the_configs():
    args = parse_args(["--model", "data/tinylm"])
    assert args.config == EngineConfig(block_size=16, history_limit=1000)
    with pytest.raises(SystemExit):
        parse_args(["--model", "data/tinylm", "--block-size", "12"])
