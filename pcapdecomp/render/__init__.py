"""Stage 4, what a person reads: report.html (report, figures), the text report (text, rerender), compare's page
(compare_page) and the ticket evidence (evidence)."""
