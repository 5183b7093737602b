"""Stage 1, captures → exchanges (face: extract.extract_points → Extracted): capture files and capture points
(capture, sources, captureset), TCP reassembly (tcp, flows), the MySQL protocol core driven over them (exchanges,
the native fast lane in fastlane), TLS keys (tlskeys), connection ids without a greeting (connids), the server's
variables file (servervars), and the extraction on several cores (extract)."""
