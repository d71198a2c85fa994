"""Driving an executor in tests: requests submitted at given steps, stepped until done."""


def drive(executor, arrivals: dict, on_step=None, limit=2000):
    """Submit arrivals[k] (a list of requests) before step k; step until nothing is left.
    on_step(step_index) runs after every step."""
    arrivals = {k: list(v) for k, v in arrivals.items()}
    k = 0
    while arrivals or executor.has_work:
        for r in arrivals.pop(k, []):
            executor.add_request(r)
        if executor.has_work:
            executor.step()
            assert executor.num_running <= executor.scheduler.max_batch_size
            if on_step is not None:
                on_step(k)
        k += 1
        assert k < limit, "the executor does not make progress"
