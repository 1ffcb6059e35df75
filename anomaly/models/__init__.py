"""Anomaly models, split by domain and re-exported here."""

from .findings import Anomaly, AnomalyKind, EntityScore
from .passes import ScoringKind, ScoringWatermark
from .registry import ModelKind, ModelStatus, ModelVersion

__all__ = ["Anomaly", "AnomalyKind", "EntityScore", "ModelKind", "ModelStatus", "ModelVersion", "ScoringKind",
           "ScoringWatermark"]
