"""``osmosis train run --ray``: the same run, its steps on a Ray cluster (extra
``distributed``; Ray is imported inside functions).

:mod:`.driver` is the machine that runs the command (:class:`~.driver.DriverSession`): it
places the run (:mod:`.placement`), starts the rollout servers (:mod:`.fleet`) and the
trainer workers (:mod:`.worker`, each a :class:`~.worker.WorkerSession`), and watches Ray
Train's controller (:mod:`.watch`) until the workers end.
"""
