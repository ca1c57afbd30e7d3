"""Lab 06, serving (notebook 06): sampling, continuous batching on the paged KV cache, preemption, load and
metrics, and an OpenAI-compatible HTTP service (`python -m labkit.serving --model data/tinylm --port 8000`).

    sampling   SamplingParams; temperature, top-k, top-p, min-p in one documented order
    sequence   Sequence: one request's tokens, images, state and timestamps
    mm         MultiModalInput: a request's images (placeholder ranges + features) -> StepInput.embeds (lab 07)
    scheduler  waiting / running / swapped queues; static, continuous and chunked-prefill policies;
               preemption by recompute or swap; priorities with a starvation bound
    batch      StepInput (one step, packed) and PagedBatch (attention per sequence over the paged pool)
    runner     Runner (what the engine needs of one), ModelRunner: the model, its KV pools and host swap space
    config     EngineConfig: the engine's configuration, checked once, resolved against the runner's pool
    engine     Engine: add_request / step / abort; offline replays of a trace on a measured or modelled clock
    workload   Poisson / gamma arrivals and request traces from the course's tasks
    metrics    TTFT, TPOT, ITL, end-to-end latency, throughput and goodput (vLLM's benchmark definitions)
    tp         TPRunner / tp_engine: the model over tensor-parallel gloo ranks (lab 04's Pool); from_builder /
               built_tp_engine: each rank builds (loads) its own shard (lab 07)
    detokenize TextDecoder: incremental UTF-8 text and OpenAI stop strings
    processor  Prompt, Processor, TextProcessor, message_parts: a request -> what the engine runs (the chat
               template; lab 07's VLMProcessor adds images)
    protocol   OpenAI's request and response bodies, APIError
    stream     RequestStream, Chunk: one request's output as an asyncio stream of text
    core       the engine core's typed messages (AddRequest, AbortRequest, Stop; Outputs, Ready, Failed), EngineCore
               (the one loop over an Engine) and run_engine_core (the engine process's main)
    service    Service: one engine behind those streams, on its own thread or in its own process
    api        make_app (FastAPI: /health, /v1/models, /v1/completions, /v1/chat/completions, /metrics,
               /openapi.json with /docs and /redoc),
               ServerThread (uvicorn in a thread); `python -m labkit.serving` starts it all
    launch     start_service / ServiceProcess: that command as a child process, healthy or an error
    register   Registrar, REGISTER_PATH, heartbeat_path, replica_path: a replica's side of discovery (lab 08's
               router): register once healthy, heartbeat, register again after a 404, deregister on stop
    explore    the plots and the scheduler widget;  exercises   the notebook's exercises
"""

from . import (batch, exercises, explore, launch, metrics, mm, processor, protocol, register, sampling, scheduler, tp,
               workload)
from .api import ServerThread
from .config import EngineConfig
from .engine import Engine, StepCost
from .runner import ModelRunner
from .sampling import SamplingParams, make_generator, probabilities, sample

__all__ = ["batch", "exercises", "explore", "launch", "metrics", "mm", "processor", "protocol", "register", "sampling",
           "scheduler", "tp", "workload", "ServerThread", "EngineConfig", "Engine", "StepCost", "ModelRunner",
           "SamplingParams", "make_generator", "probabilities", "sample"]
