"""Stage 3, the paired exchanges → where the time went (face: servers.explain_servers → Explained): the joined
table and each exchange's network, queueing and execution (decompose, bounds for what capture loss left bounded),
per DB server with its slow log and thread-pool view (servers, threadpool), the query profile (digest), and
summary.json with its verdict (summary, verdict, playbook, stories, connstory, netstory, waitprofile; wording holds
the phrases they share)."""
