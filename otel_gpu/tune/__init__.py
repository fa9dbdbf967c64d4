"""`otel-gpu tune`: DeepSpeed ZeRO-3 settings tuned by trials of the user's own launch command.

space.py (what may change), config.py (auto resolution, generation, validation), trial.py
(one trial: own folder, process group, timeout), objective.py (step time from PromQL or the
training log), study.py (Optuna ask/tell), storage.py (the shared SQLite/RDB study
storage and resume), report.py, cli.py.
"""
