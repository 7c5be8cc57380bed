// What the replay tests share: loading a deliberately broken case must fail with one line that
// names every given word (the file, the key, what was expected).
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "renaissance/error.h"
#include "renaissance/replay.h"

namespace renaissance {
namespace testing_util {

inline void expect_replay_rejected(const std::string& dir, const std::vector<std::string>& words) {
  try {
    load_replay_case(dir);
    ADD_FAILURE() << "the broken case loaded";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "not one line: " << msg;
    for (const std::string& w : words) EXPECT_NE(msg.find(w), std::string::npos) << "no '" << w << "' in: " << msg;
  }
}

}  // namespace testing_util
}  // namespace renaissance
