"""Run orchestration: a config and a run directory in, a trained, evaluated or loaded model out.

    start.start_training(config, run)     # check, lock, prepare the run dir, then session.train
    session.train(config, run, source)    # task + strategy + Trainer + Monitor, resumable
    inference.load_run / evaluate / predictor   # a run's checkpoint as a model, scored or asked

This is the one floor that puts a task (tasks/) together with the engine (train/): the
engine knows no task, a task knows no engine, and export/ops/cli reach both through here.
"""
