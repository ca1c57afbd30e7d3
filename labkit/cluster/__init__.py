"""Lab 08, beyond one service (notebook 08_cluster): graph compilation, replicas behind a router, discovery,
health and failover.

    graph      capture_decode: TinyLM's decode step as an aten graph (make_fx over the model's parts); op_table,
               fusion_groups / fused_kernels: what a fusing compiler (inductor) merges into one kernel
    buffers    liveness (views extend their base's life), plan_buffers (greedy best-fit offsets), check_plan,
               measured_peak / allocator_peak: the peak from torch's own profiler memory events
    reorder    memory_aware_order, peak_floor, reordered: reorder a graph's independent nodes to lower the peak
    compiled   compiler_available (a C++ compiler that builds what inductor builds), compare_compile:
               torch.compile against eager on the decode loop, with the verdict its repeats support
    registry   Registry: the router's one owner of replica state (up / down / removed, heartbeats, events)
    policies   round robin, least outstanding, prefix affinity (rendezvous hashing of prefix_key)
    forward    one request's trip to a replica: retries before the first byte, in-band errors after it
    router     Router, make_router_app: the OpenAI-compatible router (`python -m labkit.cluster`), the
               registration endpoints, /replicas, /health, /metrics
    counters   the router's Prometheus text (labkit_router:*)
    launch     start_router, start_replica, Cluster: a router and N replicas as processes, always stopped
    load       shared_prefix_trace, run_load (the real openai client, every request accounted for),
               prefix_hit_rate from the replicas' /metrics
    drills     the notebook's runs, one call each: answer, policy_run (a fresh cluster per policy),
               kill_under_load / hang_under_load (a replica SIGKILLed / SIGSTOPped under load, with its report)
    scale      at scale on paper: replicas of which layout serve a rate of the 3T model within TTFT / TPOT
               targets (lab 04's cost model, a prefill queue), router_limit
    explore    the notebook's figures and the rendezvous widget;  exercises   LIVENESS, PREFIX_AFFINITY

The replica's side of discovery (register when healthy, heartbeat, deregister) is labkit.serving.register.
"""

from . import (buffers, compiled, drills, exercises, explore, graph, launch, load, policies, registry, reorder, router,
               scale)

__all__ = ["buffers", "compiled", "drills", "exercises", "explore", "graph", "launch", "load", "policies", "registry",
           "reorder", "router", "scale"]
