"""Layer 6, storage: versioned artifact folders, the MLflow tracking store and its model registry."""
