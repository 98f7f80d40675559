"""What every rayk actor shares: its Ray options, supervision (supervision.py), calls to its
own methods (direct_calls.py) and the event its long polls wait on (wakeup.py). The actors
themselves live where their concept does: replication/, coordinator/, server/, controller/.

`INTERNAL_ACTOR_OPTIONS` are the Ray options of every actor a rayk cluster runs for
itself (the Controller, the brokers, their listeners and partition replicas):
- no CPU reserved, so a node holds as many partitions as its memory allows;
- no task events. Ray records every actor call as task events, which each process
  buffers and sends to the GCS, and the GCS keeps the newest 100,000 for the dashboard
  and `ray list tasks`. A cluster's own calls (supervision probes, offset reports,
  heartbeats, metadata pushes: ~30 a second on an idle 3-broker cluster with 12 partitions
  when this was measured) would otherwise fill that store and push the user's own tasks
  out of it, and each costs the GCS 0.15-0.36 ms of CPU (benchmarks/idle_floor_bench.py,
  part 1).
"""

INTERNAL_ACTOR_OPTIONS = {"num_cpus": 0, "enable_task_events": False}

CONTROLLER_NAME = "rayk-controller"  # the Controller's actor name in its cluster's Ray namespace
