"""`python -m labkit.serving --model PATH --tp N --port P`: serve a model over the OpenAI API with one command
(notebook 06, section 7 starts it as a subprocess; notebook 07 serves TinyVLM's release with it).

    python -m labkit.serving --model data/tinylm --port 8000            # then: curl localhost:8000/health
    python -m labkit.serving --model data/tinylm --port 0               # port 0: a free port, printed
    python -m labkit.serving --model data/tinyvlm --tp 2 --port 0       # a Hugging Face-style release folder
    python -m labkit.serving --model data/tinylm --port 0 --register http://127.0.0.1:9000  # join a router (lab 08)

--model is a release folder (config.json and its safetensors shards). TinyLM's own release (model_type "llama",
labkit.tinylm.checkpoint) is served here; another release is served by the loader its config.json's
"model_type" names in MODEL_TYPES:
module names imported only when that model is served, the way vLLM's ModelRegistry maps
architectures to lazily imported model classes (vllm/model_executor/models/registry.py, _LazyRegisteredModel;
ModelRegistry.register_model also takes "module:Class" strings; vLLM keys on config.json's "architectures",
here one model type is one architecture). So this package never imports the lab that adds the model (imports
only go down): labkit.day0 registers nothing, it is named here.

The options vLLM also has are spelled as vLLM spells them (vllm/engine/arg_utils.py): --tensor-parallel-size
(-tp; --tp is the same option), --max-num-seqs, --block-size, --enable-prefix-caching / --no-enable-prefix-caching
(default on, as in vLLM's V1 engine), --served-model-name (one name; vLLM takes several, the first answering).

Two processes serve TinyLM's release, as vLLM V1 splits them: this one (the HTTP server, tokenization,
detokenization, stop strings) and the engine-core process it spawns (the Engine: scheduler, model runner, and
with --tp its gloo ranks), talking through a pipe with the typed messages of labkit.serving.core; /health
reports the engine process ({"engine": {"pid", "alive"}}). Another model type's release (lab 07's TinyVLM) is
served by one process: its processor (the vision encoder) and its engine come from one loader.

The HTTP server listens first and the model loads behind it (/health answers 503 until a one-token forward
succeeded), then one line goes to stdout: "serving <model> on http://HOST:PORT/v1". SIGTERM or SIGINT stops it
cleanly (exit code 0). A missing release, a folder that is not a release of a known model type, a --tp that does
not divide the model, or another bad option exits with code 2 and a message; a release that fails to load (a
rank that cannot read its slices, named with the cause), or an engine that fails while serving (an engine
process that died included), exits with code 1.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import signal
import sys
import threading
from pathlib import Path

import torch

from .._checks import fail
from ..parallel import tensor
from ..tinylm import read_config
from .api import ServerThread, make_app
from .register import Registrar, check_http_url, routable_url
from .config import DEFAULT_BLOCK_SIZE, EngineConfig
from .config import PREEMPTION_MODES, QUEUE_ORDERS, SCHEDULING_POLICIES
from .core import checkpoint_engine
from .service import Service

DEFAULTS = EngineConfig()  # the options' defaults are the engine's own


TINYLM_MODEL_TYPE = "llama"
"""config.json's model_type of TinyLM's release (a Llama, labkit.tinylm.checkpoint): served by this package."""
MODEL_TYPES = {"tinyvlm": "labkit.day0.serve"}
"""config.json's model_type -> the module that serves it, with two functions:
engine_loader(args, config: EngineConfig) checks the options against the release (--tp, the folder), raising
ValueError / TypeError / OSError that say why, and returns the picklable load() -> Engine that the engine process
runs (labkit.serving.core); processor_loader(args) -> (processor, tokenizer), which serve in the API process."""


def model_loader(model_type: str):
    """The module MODEL_TYPES names for `model_type`, imported now (KeyError-free: ValueError)."""
    if model_type not in MODEL_TYPES:
        fail("model_type", model_type, f"one of {sorted(MODEL_TYPES)} (the model types this server can load)")
    return importlib.import_module(MODEL_TYPES[model_type])


def release_config(path: str) -> dict | None:
    """The config.json of a release folder `path` (None: `path` is not a folder holding one)."""
    file = Path(path) / "config.json"
    if not file.is_file():
        return None
    config = json.loads(file.read_text())
    if not isinstance(config, dict):
        raise ValueError(f"{file}: a JSON {type(config).__name__}, expected an object")
    return config


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive int, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive int, got {value}")
    return value


def _router_root(text: str) -> str:
    try:
        return check_http_url("--register", text, root=True)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--register ")) from None


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m labkit.serving", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a release folder with config.json: TinyLM's (data/tinylm) "
                        "or another model type's (data/tinyvlm)")
    parser.add_argument("--tp", "--tensor-parallel-size", "-tp", dest="tp", type=_positive, default=1,
                        help="tensor-parallel degree: model processes over gloo (a divisor of the heads)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (0: pick a free one)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--served-model-name", default=None, help="the model id clients use (default: the file name)")
    parser.add_argument("--num-blocks", type=_positive, default=None,
                        help="KV-cache blocks in the pool (default: max-num-seqs full contexts)")
    parser.add_argument("--block-size", type=_positive, default=DEFAULT_BLOCK_SIZE,
                        help="tokens per KV block (a power of two)")
    parser.add_argument("--max-num-seqs", type=_positive, default=DEFAULTS.max_num_seqs,
                        help="requests in the running batch at most")
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                        default=DEFAULTS.enable_prefix_caching,
                        help="share the KV blocks of common prompt prefixes (default: on, as in vLLM)")
    parser.add_argument("--policy", choices=SCHEDULING_POLICIES, default=DEFAULTS.policy, help="batching policy")
    parser.add_argument("--preemption", choices=PREEMPTION_MODES, default=DEFAULTS.preemption,
                        help="when KV blocks run out")
    parser.add_argument("--order", choices=QUEUE_ORDERS, default=DEFAULTS.order,
                        help="who goes first among waiting requests of one priority: first come, shortest prompt, "
                             "or predicted shortest job (max_tokens left), under the scheduler's starvation bound")
    parser.add_argument("--threads", type=_positive, default=max(1, (os.cpu_count() or 1) - 1),
                        help="torch threads for the model (default: the cores but one, left to the HTTP server and "
                             "the clients: on 2 cores, 1 thread serves faster under load, benchmarks/RESULTS.md)")
    parser.add_argument("--stream-interval", type=_positive, default=1,
                        help="tokens per streamed chunk at least (SGLang's option: fewer events, coarser streaming)")
    parser.add_argument("--register", type=_router_root, default=None, metavar="ROUTER_ROOT",
                        help="register with the router at this root URL (http://127.0.0.1:PORT, no /v1) once "
                             "healthy, heartbeat, deregister on exit (labkit.serving.register; lab 08); with a "
                             "wildcard --host (0.0.0.0, ::) it registers its 127.0.0.1 URL")
    parser.add_argument("--heartbeat-interval", type=_seconds, default=0.25, metavar="S",
                        help="seconds between heartbeats to the router (default 0.25)")
    parser.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"))
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be in [0, 65535], got {args.port}")
    try:
        args.config = engine_config(args)
    except (ValueError, TypeError) as e:
        parser.error(f"--{str(e).split()[0].replace('_', '-')}: {e}")
    args.load, args.release, args.stem = None, None, Path(args.model).resolve()
    try:
        config = release_config(args.model)
        if config is not None and config.get("model_type") != TINYLM_MODEL_TYPE:  # its model type's module
            args.release = model_loader(config.get("model_type"))
            args.load = args.release.engine_loader(args, args.config)  # checks the options
    except (ValueError, TypeError, OSError, ImportError) as e:
        parser.error(f"--model {args.model}: {e}")
    if config is None:
        parser.error(f"--model {args.model}: no release there (a folder with config.json, e.g. data/tinylm); "
                     f"rebuild TinyLM's with `python -m labkit.tinylm.train`")
    if args.load is None:  # TinyLM: check --tp against its config here (exit 2), before the HTTP server starts
        try:
            cfg = read_config(args.stem)
        except (ValueError, TypeError, OSError) as e:  # config.json is not TinyLM's (the key, the file)
            parser.error(f"--model {args.model}: {e}")
        try:
            tensor.check_tp(cfg, args.tp)
        except ValueError as e:
            parser.error(f"--tp {args.tp}: {e}")
    args.name = args.served_model_name or args.stem.name
    return args


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """The EngineConfig the options give (KV pool, batch, policy, preemption; the last 1000 steps' history)."""
    return EngineConfig(num_blocks=args.num_blocks, block_size=args.block_size, max_num_seqs=args.max_num_seqs,
                        policy=args.policy, preemption=args.preemption, order=args.order,
                        enable_prefix_caching=args.enable_prefix_caching, history_limit=1000)


def engine_loader(args: argparse.Namespace):
    """The picklable function the engine process runs to build the Engine the options describe, torch on
    --threads threads there: core.checkpoint_engine with the checkpoint, --tp and the EngineConfig, or for
    another model type the load() its module's engine_loader made in parse_args."""
    if getattr(args, "load", None) is not None:
        return args.load
    return functools.partial(checkpoint_engine, args.stem, args.tp, args.config, args.threads)


def main(argv=None) -> int:
    args = parse_args(argv)
    load_processor = None
    if args.release is not None:  # its processor (a vision encoder, ...) serves in this process, loaded once the
        torch.set_num_threads(args.threads)  # engine process is ready
        load_processor = functools.partial(args.release.processor_loader, args)
    service = Service(engine_loader(args), stream_interval=args.stream_interval, process=True,
                      load_processor=load_processor)
    try:
        server = ServerThread(make_app(service, args.name), args.host, args.port, args.log_level)
    except OSError as e:
        print(f"cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server.start()  # listening before the model loads: /health says 503 meanwhile
    service.start()
    print(f"serving {args.name} on {server.url}/v1", flush=True)
    registrar = None
    if args.register:  # joins the router once /health would answer 200; deregisters before the server stops
        url = routable_url(f"{server.url}/v1")  # 0.0.0.0 / :: listen everywhere; the router connects to loopback
        if url != f"{server.url}/v1":
            print(f"registering {url} with the router (listening on {server.url})", flush=True)
        registrar = Registrar(args.register, url, args.name, lambda: service.state == "ready",
                              service.stats, args.heartbeat_interval).start()
    code = 0
    while not stop.wait(0.2):
        if service.state == "failed":
            print(f"the service failed: {service.error}", file=sys.stderr)
            code = 1
            break
    if registrar is not None:
        registrar.stop()
    server.stop()
    service.stop()
    return code


if __name__ == "__main__":
    sys.exit(main())
