"""Study verdicts and their markdown / JSON / plot reports."""

from rayb.report.study_report import ModelRow, Verdict, build_verdict, format_table, write_report

__all__ = ["ModelRow", "Verdict", "build_verdict", "format_table", "write_report"]
