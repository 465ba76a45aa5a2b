"""The serving layer: exact evaluation, reports, exports and classification of files."""
