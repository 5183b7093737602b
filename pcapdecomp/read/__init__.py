"""Stage 1, captures → exchanges: capture files and capture points (capture, sources, captureset), TCP
reassembly (tcp, flows), the MySQL protocol core driven over them (exchanges, the native fast lane in fastlane),
TLS keys (tlskeys), connection ids without a greeting (connids), and the extraction on several cores (extract)."""
