#!/usr/bin/perl
# Test oracle: runs percona-toolkit's own QueryRewriter::fingerprint on many queries in one Perl process.
#
# Usage: perl pt_oracle.pl TOOL [OPTION=0|1 ...]
#   TOOL is /usr/bin/pt-fingerprint or /usr/bin/pt-query-digest (their QueryRewriter copies differ).
#   OPTIONs are passed to QueryRewriter->new, e.g. match_embedded_numbers=1 match_md5_checksums=1.
# stdin:  records "<byte length>\n<query bytes>", any bytes allowed (NUL, newlines, invalid UTF-8).
# stdout: records "OK <byte length>\n<fingerprint bytes>" or "ERR <byte length>\n<perl error>".
#
# Loading the tool with `do` runs its fat-packed modules but not main() (it ends with
# `exit main(@ARGV) if !caller`). pt-fingerprint --query prints exactly QueryRewriter->fingerprint($query);
# reading bytes keeps Perl's byte semantics, as for --query and for slow logs.
use strict;
use warnings;

my ($tool, @opts) = @ARGV;
{
   local @ARGV = ();
   do $tool;
   die "cannot load $tool: $@$!\n" if $@ || !defined &QueryRewriter::fingerprint;
}
my %args = map { split /=/, $_, 2 } @opts;
my $qr = QueryRewriter->new(QueryParser => QueryParser->new(), %args);

binmode STDIN;
binmode STDOUT;
$| = 1;  # one reply per request: the test streams queries through one process
while ( defined(my $header = <STDIN>) ) {
   chomp $header;
   my $query = '';
   my $got = $header > 0 ? read(STDIN, $query, $header) : 0;
   die "short read\n" if $got != $header;
   my $fp = eval { $qr->fingerprint($query) };
   if ( defined $fp ) {
      print "OK ", length($fp), "\n", $fp;
   }
   else {
      my $err = $@ || 'undef';
      print "ERR ", length($err), "\n", $err;
   }
}
