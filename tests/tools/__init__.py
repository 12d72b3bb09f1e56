"""Tests of the utilities (nsq_tail, to_nsq, nsq_to_file, nsq_to_http, nsq_to_nsq, nsq_stat)."""
