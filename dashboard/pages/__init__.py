"""Operator pages beyond the fleet overview and the rack heatmap, one module per area."""
