"""The load generator: arrival schedule, streaming client, metrics, report.

One job per module:
  arrivals  planned send offsets (Poisson / gamma), computed before the clock
  ramp      a load ramp (--ramp-up-strategy): each request's offered rate, figures per rate bucket
  client    the streaming OpenAI-compatible request function (never raises)
  metrics   one pure function from per-request records to a result
  report    the console block and the JSON result file
  serverstats  GET /v1/models, /metrics scrapes and the codec figures of a run
  sysinfo   run metadata (versions, CPU/GPU, git revision)
  progress  the progress bar on stderr (tqdm)
  runner    ``run_benchmark``: warmup, scrape /metrics, send the load, compute
  fanout    where the timed load comes from: this process, worker processes or Ray
  workers   one load worker's job (``drive``), splitting the schedule, merging records
  pool      ``--workers N``: spawned client processes sharing one start instant
  rayload   ``--ray``: the same worker as Ray actors on many hosts (optional extra)
  looplag   event-loop lag of a client process
  guard     the client-bottleneck guard: did the client limit the run?
  flags     the load flags (bench load, and the experiments' load group)
"""
