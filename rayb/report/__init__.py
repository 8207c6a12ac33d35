"""Study verdicts and their markdown / JSON / plot reports."""

from rayb.report.study_report import (
    StudyReport,
    Verdict,
    build_report,
    build_verdict,
    format_table,
    write_report,
)

__all__ = ["StudyReport", "Verdict", "build_report", "build_verdict", "format_table", "write_report"]
