"""The model card: what a fitted model is, typed (saved beside it as JSON)."""
from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field


class ModelCard(BaseModel):
    """A fitted performance model's description: what it learned from, how well it
    predicts what it was not fitted on, and what the fast predictor evaluates (``light``).
    An infinite figure is written as JSON's ``Infinity`` (which Python's json reads back),
    not as null: a measured group's loss that became NaN is kept as infinite
    (``results.DIVERGED``), and as null the plan read the run as one without a loss."""
    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="constants")

    model_id: str
    estimator: str
    feature_version: int
    features: list[str]
    target: str = "log(seconds per step) - features.baseline"
    residual_range: list[float] = Field(
        default_factory=lambda: [-1e9, 1e9],
        description="the learned part's predictions are held within this range (log space: "
                    "the training data's, widened by fit.RANGE_MARGIN): a step is never "
                    "predicted more or less efficient than any measured one by far")
    machine_effects: dict[str, float] = Field(
        default_factory=dict,
        description="log slowdown of each machine (features.machine: its probe's figures) "
                    "against its nominal target's median machine, as the runs it shares with "
                    "another machine of that target show it (fit.machine_effects); added to "
                    "a prediction there, none for a machine not listed")
    rows: int = Field(description="measurements fitted on")
    configurations: int
    families: list[str] = Field(description="workload families in the data")
    targets: list[str] = Field(description="targets in the data (microarchitecture / cores)")
    data_fingerprint: str
    held_out_by: Literal["configuration", "workload", "target"] = Field(
        description="what was held out to compare the estimators")
    held_out_mape: dict[str, Optional[float]]
    held_out_rows: Optional[int] = Field(
        None, description="the measurements the held-out figures (held_out_mape, the sigmas) "
                          "were measured on: fewer than rows where a refit after a run "
                          "carried them over (fit.refit_after_run); None in older cards")
    sigma_log: float = Field(description="RMS error in log space, a configuration held out")
    sigma_log_unseen: float = Field(description="RMS error in log space, a whole workload "
                                    "family (or target) held out: the uncertainty for one "
                                    "never measured")
    sigma_log_unseen_by_framework: dict[str, float] = Field(
        default_factory=dict, description="sigma_log_unseen of each framework's rows alone, "
        "for a framework with two or more families held out: a new workload's uncertainty "
        "in its own framework (a Keras family held out is far further off than a PyTorch "
        "one); none in older cards")
    versions: dict[str, str]
    fitted_at: str
    light: dict[str, Any] = Field(default_factory=dict, description="for the fast predictor: "
                                  "the exported linear formula, measured medians, workloads")


class Comparison(BaseModel):
    """The estimators' comparison on held-out groups that a fit keeps the best of
    (``fit.compare``), and what it was made on: a fit of the same estimators on the same
    measurements and features takes it as it is (``fit.shipped_comparison``: the quick
    estimators' on the shipped datasets, which a first plan would otherwise compute)."""
    model_config = ConfigDict(extra="forbid", frozen=True)

    estimators: list[str] = Field(description="the estimators compared, in order")
    data_fingerprint: str = Field(description="fit.fingerprint of the measurements compared on")
    feature_version: int
    estimator: str = Field(description="the one kept")
    held_out_by: Literal["configuration", "workload", "target"]
    held_out_mape: dict[str, Optional[float]]
    rows: int = Field(description="measurements compared on")
    held_out_rows: int
    sigma_log: float
    sigma_log_unseen: float
    sigma_log_unseen_by_framework: dict[str, float] = Field(default_factory=dict)
    versions: dict[str, str] = Field(description="the libraries it was computed with")
