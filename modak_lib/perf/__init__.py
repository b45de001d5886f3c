"""The performance model, in one package: features, fitting and persistence, the planner's
fast predictor, evaluation, and the target probe.

- :mod:`.features`: what a workload, a target and a configuration are, as numbers (one
  function for fitting and for planning);
- :mod:`.fit`: fitting with pandas and scikit-learn, the model card (:mod:`.card`), saving,
  loading (a stale model is refitted);
- :mod:`.predictor`: the planner's predictor (standard library only) and ``load_predictor``;
- :mod:`.evaluate`: held-out errors (configuration, workload family, target) and regret;
- :mod:`.probe`: the target's measured GFLOP/s and bandwidth, cached.

The CLI, the Ansible actions and the benchmarks call these; none of them calls another.
"""
