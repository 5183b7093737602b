"""The MySQL protocol core, sans-IO: the wire format (wire), packet framing (framing), the command → response table
(responses), the connection's state machine (connection), content detection (detect), prepared statements'
parameters (params), TLS records (tls) and the native row walker's twin (walk). It imports nothing of the stages:
bytes in, exchanges out."""
