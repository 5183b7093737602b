"""The slow query log: read as a sans-IO parser of the MySQL, Percona and MariaDB formats (reader), its SQL text
(sqltext), and joined to the exchanges it describes (join)."""
