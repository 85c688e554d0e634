"""SavedModel export for TF Serving (built in a later issue)."""
