"""SavedModel export for TF Serving: `kbert.serving.export.export_model` (`kbert export`)."""
