"""A study's report: the verdict and its evidence as markdown, self-contained HTML, JSON and plots
(study_report.py), built from the results table and the provenance record alone."""
