"""ALFWorld and generic TextWorld games on their real engines."""
