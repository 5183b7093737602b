"""Stage 3, the joined table → where the time went: each exchange's network, queueing and execution
(decompose), the thread-pool view (threadpool), the query profile (digest), and summary.json with its verdict
(summary, verdict, playbook, stories, waitprofile)."""
