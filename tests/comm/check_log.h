// Shared by the mpirun test programs of tests/comm: the log of their checks. Every rank counts
// its failed checks; the lead rank prints each ("ok   WHAT" or "FAIL WHAT"). verdict() joins the
// ranks' counts (any failure anywhere fails every rank) and prints PASS or FAIL once.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "renaissance/communicator.h"

struct CheckLog {
  bool lead;
  int32_t failures = 0;

  void operator()(bool ok, const std::string& what) {
    if (!ok) ++failures;
    if (lead) std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  }
  // The exit status of the program: 0 when no rank failed a check.
  int verdict(renaissance::Communicator& comm, const char* pass, const char* fail) {
    comm.all_reduce_max_i32(&failures, 1);
    if (lead) std::printf("%s\n", failures ? fail : pass);
    return failures ? 1 : 0;
  }
};
