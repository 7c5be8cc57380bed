// The hyperparameter table (renaissance/hyperparameters.h) as the surfaces read it, row by row,
// so that a new row is covered without a new test: each number is validated by its row's rule
// (check_hyperparameter and OptimizerConfig::validate name it), a flag is not a number, every
// row's value goes through a checkpoint's META and back for every kind, the optional rows cost a
// file no bytes at their defaults, and the builders' defaults are the table's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "renaissance/hyperparameters.h"
#include "renaissance/plan.h"
#include "support/checkpoint_test_util.h"

namespace renaissance {
namespace {

using namespace checkpoint_test;

// A valid value other than every kind's default, by the row's rule.
double other_value(const HyperparameterInfo& row) {
  switch (row.rule) {
    case HyperRule::kLr: return 0.003;
    case HyperRule::kNonNegative: return 0.0625;
    case HyperRule::kUnitInterval: return 0.8125;
    case HyperRule::kPositive: return 3e-7;
    case HyperRule::kMaxGradNorm: return 7.5;
    case HyperRule::kFloat32: return 0.375;
    case HyperRule::kFlag: return row.fixed_default != 0.0 ? 0.0 : 1.0;  // the other of on / off
    case HyperRule::kSteps: return 7.0;
    case HyperRule::kChoice: return 1.0;
  }
  return 0.0;
}

// Values the row's rule refuses: not finite, and negative or beyond a float32 by the rule (a
// float32-only row, as torch's dampening, takes any sign).
std::vector<double> bad_values(const HyperparameterInfo& row) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  if (row.rule == HyperRule::kFloat32) return {nan, inf, -inf, 1e39};
  if (row.rule == HyperRule::kSteps) return {nan, 0.0, 101.0, 2.5, -1.0, inf};
  if (row.rule == HyperRule::kChoice) return {nan, -1.0, 2.0, 0.5, inf};
  return {nan, -1.0, inf};
}

// Whether a kind takes the row's other value: a row read by some families only may be refused by
// the others' cross-field rules (dampening: the SGD kinds only, and not Nesterov's).
bool kind_takes(OptimizerConfig c, const HyperparameterInfo& row) {
  set_hyper_value(c, row, other_value(row));
  try {
    c.validate();
    return true;
  } catch (const Error&) {
    return false;
  }
}

TEST(HyperparameterTable, FlagsAreTheNamesSpelledForTheCommandLine) {
  for (const HyperparameterInfo& row : kHyperparameterTable) {
    std::string flag = std::string("--") + row.name;
    for (char& c : flag) c = c == '_' ? '-' : c;
    EXPECT_EQ(flag, row.flag);
    EXPECT_EQ(find_hyperparameter(row.name), &row);
    EXPECT_TRUE(row.help != nullptr && row.help[0] != '\0') << row.name;
  }
  EXPECT_EQ(find_hyperparameter("learning_rate"), nullptr);
  EXPECT_EQ(find_hyperparameter(std::string("lr\0x", 4)), nullptr);
}

TEST(HyperparameterTable, EachNumberIsValidatedByItsRowAndNamed) {
  for (const HyperparameterInfo& row : kHyperparameterTable) {
    if (row.number == nullptr) {
      // A flag is a bool: no surface may pass it as a number.
      EXPECT_THROW(check_hyperparameter(row.name, 1.0), Error) << row.name;
      continue;
    }
    EXPECT_NO_THROW(check_hyperparameter(row.name, other_value(row))) << row.name;
    for (double bad : bad_values(row)) {
      try {
        check_hyperparameter(row.name, bad);
        ADD_FAILURE() << row.name << " accepted " << bad;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(std::string("invalid ") + row.name + " = "), std::string::npos) << e.what();
      }
      OptimizerConfig c = default_config(OptimizerKind::kAdamW);
      c.*row.number = bad;
      try {
        c.validate();
        ADD_FAILURE() << "validate() accepted " << row.name << " = " << bad;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(row.name), std::string::npos) << e.what();
      }
    }
  }
  EXPECT_THROW(check_hyperparameter("learning_rate", 0.1), Error);
}

TEST(HyperparameterTable, DefaultsComeFromTheKindTableOrTheRow) {
  for (const KindInfo& k : kKindTable) {
    const OptimizerConfig d = default_config(k.kind), r = reference_config(k.kind);
    for (const HyperparameterInfo& row : kHyperparameterTable) {
      const double want_d = row.kind_column != nullptr ? k.defaults.*row.kind_column : row.fixed_default;
      const double want_r = row.kind_column != nullptr ? k.reference.*row.kind_column : row.fixed_default;
      EXPECT_EQ(hyper_value(d, row), want_d) << k.name << " " << row.name;
      EXPECT_EQ(hyper_value(r, row), want_r) << k.name << " " << row.name;
      EXPECT_EQ(hyper_default(k.kind, row), want_d) << k.name << " " << row.name;
    }
  }
}

TEST(HyperparameterTable, EveryRowGoesThroughACheckpointForEveryKind) {
  TempDir dir;
  std::vector<bool> taken(kNumHyperparameters, false);  // some kind took the row at its other value
  for (const KindInfo& k : kKindTable) {
    // Every row the kind takes at its other value, the others at their defaults.
    OptimizerConfig c = default_config(k.kind);
    std::vector<double> want(kNumHyperparameters);
    for (const HyperparameterInfo& row : kHyperparameterTable) {
      if (kind_takes(c, row)) set_hyper_value(c, row, other_value(row));
      want[static_cast<size_t>(row.id)] = hyper_value(c, row);
    }
    ASSERT_NO_THROW(c.validate()) << k.name;
    for (const HyperparameterInfo& row : kHyperparameterTable) {
      if (hyper_value(c, row) == other_value(row)) taken[static_cast<size_t>(row.id)] = true;
    }
    auto task = make_task(tiny_params(), c, BackendKind::kCpu, 1);
    const std::string path = dir.file(std::string(k.name) + ".ckpt");
    task->save(path);
    const CheckpointInfo info = read_checkpoint_info(path);
    for (const HyperparameterInfo& row : kHyperparameterTable) {
      EXPECT_EQ(hyper_value(info.config, row), want[static_cast<size_t>(row.id)]) << k.name << " " << row.name;
    }
    // And a task that loads it takes every row (it was built at the kind's defaults).
    // Clipping on/off and the rows fixed after compile (amsgrad's VMAX family, Muon's adjust_lr
    // and mode) are part of the compiled step: the loading task has them as the file has.
    OptimizerConfig base = default_config(k.kind);
    if (c.max_grad_norm > 0.0) base.max_grad_norm = 1.0;
    for (const HyperparameterInfo& row : kHyperparameterTable) {
      if (row.fixed_after_compile) set_hyper_value(base, row, hyper_value(c, row));
    }
    auto other = make_task(tiny_params(), base, BackendKind::kCpu, 1);
    other->load(path);
    for (const HyperparameterInfo& row : kHyperparameterTable) {
      EXPECT_EQ(hyper_value(other->group_config(0), row), want[static_cast<size_t>(row.id)]) << k.name << " " << row.name;
    }
  }
  for (const HyperparameterInfo& row : kHyperparameterTable) {
    EXPECT_TRUE(taken[static_cast<size_t>(row.id)]) << "no kind took " << row.name << " at its other value";
  }
}

TEST(HyperparameterTable, OptionalRowsAtTheirDefaultsAddNoBytes) {
  TempDir dir;
  // sgd_momentum takes every optional row but amsgrad (adam, adamw), whose file also gains the
  // VMAX section (its bytes: test_amsgrad.cc, CheckpointCarriesVmax). A row that switches a family
  // on (as amsgrad does VMAX) adds that family's section, not only META bytes: left out here.
  OptimizerConfig c = default_config(OptimizerKind::kSgdMomentum);
  auto plain = make_task(tiny_params(), c, BackendKind::kCpu, 1);
  plain->save(dir.file("plain.ckpt"));
  const size_t plain_size = read_file(dir.file("plain.ckpt")).size();
  size_t optional_bytes = 0;
  for (const HyperparameterInfo& row : kHyperparameterTable) {
    if (row.meta != MetaPlace::kOptional || !kind_reads(c.kind, row)) continue;
    OptimizerConfig switched = c;
    set_hyper_value(switched, row, other_value(row));
    if (plan_config_from_optimizer(switched).families != plan_config_from_optimizer(c).families) continue;
    optional_bytes += row.number != nullptr ? 8 : 4;
    set_hyper_value(c, row, other_value(row));
  }
  ASSERT_GT(optional_bytes, 0u) << "no optional row was switched: the comparison below would be empty";
  auto all = make_task(tiny_params(), c, BackendKind::kCpu, 1);
  all->save(dir.file("all.ckpt"));
  EXPECT_EQ(read_file(dir.file("all.ckpt")).size(), plain_size + optional_bytes);
}

// The writer stops at the last optional row off its default, so a file whose META ends with a
// number row at its default was not written by it: refused, naming the row (for dampening, as the
// field's own reader did). The same file with the value left as saved loads.
TEST(HyperparameterTable, AnOptionalNumberAtItsDefaultEndingMetaIsRefused) {
  const HyperparameterInfo* last = nullptr;
  // The last optional number row (muon_mode; a later flag row, left at its default, would not be
  // written, so META ends with the number).
  for (const HyperparameterInfo& row : kHyperparameterTable) {
    if (row.meta == MetaPlace::kOptional && row.number != nullptr) last = &row;
  }
  ASSERT_NE(last, nullptr);
  TempDir dir;
  OptimizerConfig c = default_config(OptimizerKind::kMuon);  // a kind that reads it
  ASSERT_TRUE(kind_reads(c.kind, *last));
  set_hyper_value(c, *last, other_value(*last));
  make_task(tiny_params(), c, BackendKind::kCpu, 1)->save(dir.file("saved.ckpt"));
  EXPECT_EQ(hyper_value(read_checkpoint_info(dir.file("saved.ckpt")).config, *last), other_value(*last));
  // META is the first section: its payload's last 8 bytes are the row's f64; the checksum follows.
  std::vector<uint8_t> file = read_file(dir.file("saved.ckpt"));
  ASSERT_EQ(std::memcmp(&file[24], "META", 4), 0);
  uint64_t length;
  std::memcpy(&length, &file[28], 8);
  double stored;
  std::memcpy(&stored, &file[24 + 12 + length - 8], 8);
  ASSERT_EQ(stored, other_value(*last));
  std::memcpy(&file[24 + 12 + length - 8], &last->fixed_default, 8);
  const uint64_t sum = XXH3_64bits(&file[24], 12 + length);
  std::memcpy(&file[24 + 12 + length], &sum, 8);
  write_file(dir.file("default.ckpt"), file);
  expect_error([&] { read_checkpoint_info(dir.file("default.ckpt")); },
               [&] {
                 std::ostringstream os;  // the default as the reader prints it (a stream's default format)
                 os << last->name << " " << last->fixed_default << " is written by leaving the field out";
                 return os.str();
               }(),
               ErrorKind::kFormat);
}

}  // namespace
}  // namespace renaissance
