"""Load stage: the catalog, hardware facts, template manifests and committed tables, read from
YAML and JSON into typed values with located diagnostics."""
