// Tests of layout JSON parsing and the embedded built-in layouts: the five layouts are present,
// identical to the files in data/layouts/, with the parameter counts of docs/design.md; malformed layouts
// are errors naming the source, the parameter and the key.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "renaissance/error.h"
#include "renaissance/layout.h"
#include "support/test_util.h"

namespace renaissance {
namespace {

void expect_format_error(const std::string& json, const std::vector<std::string>& words) {
  try {
    parse_layout(json, "my.json");
    ADD_FAILURE() << "no error for " << json;
  } catch (const Error& e) {
    EXPECT_EQ(static_cast<int>(e.kind()), static_cast<int>(ErrorKind::kFormat)) << e.what();
    const std::string msg = e.what();
    EXPECT_NE(msg.find("my.json"), std::string::npos) << msg;
    for (const std::string& w : words) EXPECT_NE(msg.find(w), std::string::npos) << msg;
  }
}

TEST(Layout, ParsesParams) {
  const Layout l = parse_layout(
      R"({"name":"m","params":[{"name":"a","shape":[2,3],"role":"deep_conv"},{"name":"b","shape":[],"role":"bn_bias"},)"
      R"({"name":"c","shape":[0],"role":"fc_bias"}]})",
      "m.json");
  EXPECT_EQ(l.name, "m");
  ASSERT_EQ(l.params.size(), 3u);
  EXPECT_EQ(l.params[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(l.params[0].role, Role::kDeepConv);
  EXPECT_EQ(l.params[1].numel(), 1);
  EXPECT_EQ(l.params[2].numel(), 0);
  EXPECT_EQ(l.total_numel(), 7);
}

TEST(Layout, BuiltinsMatchDesignCounts) {
  const std::vector<std::string> names = builtin_layout_names();
  EXPECT_EQ(names, (std::vector<std::string>{"bert_base", "gpt2_small", "mobilenet_v3_large", "resnet50", "vit_b_16"}));
  struct Expected {
    const char* name;
    size_t tensors;
    int64_t params;
  };
  for (const Expected& e : {Expected{"resnet50", 161, 25557032}, Expected{"bert_base", 199, 109482240},
                            Expected{"gpt2_small", 148, 124439808}}) {
    const Layout l = builtin_layout(e.name);
    EXPECT_EQ(l.name, e.name);
    EXPECT_EQ(l.params.size(), e.tensors) << e.name;
    EXPECT_EQ(l.total_numel(), e.params) << e.name;
  }
}

TEST(Layout, BuiltinsAreTheRepositoryFiles) {
  for (const std::string& name : builtin_layout_names()) {
    const std::string path = testing_util::source_dir() + "/data/layouts/" + name + ".json";
    std::ifstream in(path);
    ASSERT_TRUE(in) << path << " is missing from the repository";
    const Layout file = load_layout_file(path);
    const Layout builtin = builtin_layout(name);
    ASSERT_EQ(file.params.size(), builtin.params.size()) << name;
    for (size_t i = 0; i < file.params.size(); ++i) {
      EXPECT_EQ(file.params[i].name, builtin.params[i].name);
      EXPECT_EQ(file.params[i].shape, builtin.params[i].shape);
      EXPECT_EQ(file.params[i].role, builtin.params[i].role);
    }
  }
}

TEST(Layout, UnknownBuiltinListsTheKnownOnes) {
  try {
    builtin_layout("resnet51");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("resnet51"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("resnet50"), std::string::npos);
  }
  EXPECT_THROW(resolve_layout("resnet51"), Error);
  EXPECT_EQ(resolve_layout("resnet50").params.size(), 161u);
}

TEST(Layout, MissingFileIsIoError) {
  try {
    load_layout_file("/nonexistent/x.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(static_cast<int>(e.kind()), static_cast<int>(ErrorKind::kIo));
    EXPECT_NE(std::string(e.what()).find("/nonexistent/x.json"), std::string::npos);
  }
}

TEST(Layout, InvalidJson) { expect_format_error("{\"params\": [", {"JSON"}); }
TEST(Layout, NotAnObject) { expect_format_error("[]", {"object"}); }
TEST(Layout, MissingParams) { expect_format_error(R"({"name":"x"})", {"params"}); }
TEST(Layout, UnknownTopLevelKey) { expect_format_error(R"({"params":[],"parmas":[]})", {"'parmas'"}); }
TEST(Layout, UnknownParamKey) {
  expect_format_error(R"({"params":[{"name":"a","shape":[1],"role":"fc_bias","dtype":"f32"}]})", {"'a'", "'dtype'"});
}
TEST(Layout, UnknownRole) {
  expect_format_error(R"({"params":[{"name":"a","shape":[1],"role":"conv_weird"}]})", {"'a'", "role", "conv_weird"});
}
TEST(Layout, BadShape) {
  expect_format_error(R"({"params":[{"name":"a","shape":[2,-1],"role":"fc_bias"}]})", {"'a'", "shape"});
  expect_format_error(R"({"params":[{"name":"a","shape":[1.5],"role":"fc_bias"}]})", {"'a'", "shape"});
  expect_format_error(R"({"params":[{"name":"a","shape":"3","role":"fc_bias"}]})", {"'a'", "shape"});
}
TEST(Layout, DuplicateName) {
  expect_format_error(
      R"({"params":[{"name":"a","shape":[1],"role":"fc_bias"},{"name":"a","shape":[1],"role":"fc_bias"}]})",
      {"params[1]", "duplicate"});
}
// "optimizer": "adamw" marks a tensor for a muon task's auxiliary AdamW; "muon" is the weight
// roles' default; without the key every tensor goes by its role.
TEST(Layout, OptimizerMark) {
  const Layout l = parse_layout(
      R"({"params":[{"name":"emb","shape":[10,4],"role":"fc_weight","optimizer":"adamw"},)"
      R"({"name":"w","shape":[4,4],"role":"fc_weight","optimizer":"muon"},{"name":"w2","shape":[4,4],"role":"deep_conv"},)"
      R"({"name":"b","shape":[4],"role":"fc_bias","optimizer":"adamw"}]})",
      "m.json");
  ASSERT_EQ(l.params.size(), 4u);
  EXPECT_EQ(l.params[0].optimizer, ParamOptimizer::kAdamW);
  EXPECT_EQ(l.params[0].role, Role::kFcWeight);  // the role stays; the plan of a muon task moves it
  EXPECT_EQ(l.params[1].optimizer, ParamOptimizer::kRole);
  EXPECT_EQ(l.params[2].optimizer, ParamOptimizer::kRole);
  EXPECT_EQ(l.params[3].optimizer, ParamOptimizer::kAdamW);
}
TEST(Layout, BadOptimizerMarkNamesTheParameter) {
  expect_format_error(R"({"params":[{"name":"emb","shape":[2,2],"role":"fc_weight","optimizer":"sgd"}]})",
                      {"params[0]", "'emb'", "optimizer", "'sgd'", "adamw"});
  expect_format_error(R"({"params":[{"name":"emb","shape":[2,2],"role":"fc_weight","optimizer":"AdamW"}]})",
                      {"'emb'", "'AdamW'"});
  expect_format_error(R"({"params":[{"name":"emb","shape":[2,2],"role":"fc_weight","optimizer":1}]})",
                      {"'emb'", "optimizer 1"});
  // Muon never steps a bias-like role.
  expect_format_error(R"({"params":[{"name":"b","shape":[2],"role":"bn_bias","optimizer":"muon"}]})",
                      {"'b'", "bn_bias", "muon"});
}
TEST(Layout, MissingName) { expect_format_error(R"({"params":[{"shape":[1],"role":"fc_bias"}]})", {"params[0]", "name"}); }

}  // namespace
}  // namespace renaissance
