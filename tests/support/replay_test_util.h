// What the replay tests share: loading a deliberately broken case must fail with one line that
// names every given word (the file, the key, what was expected).
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "renaissance/error.h"
#include "renaissance/replay.h"

namespace renaissance {
namespace testing_util {

// One hyperparameter group of a case that a test writes: its configuration and its tensors.
struct CaseGroup {
  OptimizerConfig config;
  std::vector<ParamSpec> params;
};

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

// The case in `dir` with case.json replaced by `j` changed by edit(j) must be refused naming
// every word.
template <typename Edit>
void expect_case_edit_rejected(const std::string& dir, nlohmann::json j, Edit&& edit,
                               const std::vector<std::string>& words) {
  edit(j);
  std::ofstream(dir + "/case.json", std::ios::binary | std::ios::trunc) << j.dump();
  expect_replay_rejected(dir, words);
}

}  // namespace testing_util
}  // namespace renaissance
