// Tests of the safetensors reader and writer: round trips of F32/F64/I64 and of the precision
// table's encodings (bit patterns), atomic writes, and one test per malformed input the reader
// must reject with Error naming the file and the tensor (never a crash or a huge allocation).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/src/io/checkpoint_testing.h"
#include "renaissance/error.h"
#include "renaissance/safetensors.h"
#include "support/test_util.h"

namespace renaissance {
namespace {

// A fresh folder per test, removed with its files afterwards.
class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing_util::make_temp_dir("/tmp/rn-st-XXXXXX");
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override { std::system(("rm -rf '" + dir_ + "'").c_str()); }

  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  static void write_raw(const std::string& p, const std::string& bytes) {
    std::ofstream out(p, std::ios::binary);
    out << bytes;
  }
  // A file with the given header JSON text and `data_bytes` zero bytes of data.
  static std::string file_bytes(const std::string& header, size_t data_bytes) {
    std::string b(8, '\0');
    const uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(n >> (8 * i));
    return b + header + std::string(data_bytes, '\0');
  }
  // Expects Error(kind) whose message contains every word.
  template <typename F>
  static void expect_error(F&& f, ErrorKind kind, const std::vector<std::string>& words) {
    try {
      f();
      ADD_FAILURE() << "no error thrown";
    } catch (const Error& e) {
      EXPECT_EQ(static_cast<int>(e.kind()), static_cast<int>(kind)) << e.what();
      for (const std::string& w : words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
    }
  }

  // A file of `header` and `data_bytes` zero bytes must be refused on opening (kFormat), with a
  // message naming every word.
  void expect_open_refused(const std::string& header, size_t data_bytes, const std::vector<std::string>& words) const {
    write_raw(path("a.safetensors"), file_bytes(header, data_bytes));
    expect_error([&] { SafetensorsReader r(path("a.safetensors")); }, ErrorKind::kFormat, words);
  }

  std::string dir_;
};

TEST_F(SafetensorsTest, RoundTripKeepsBitsOfEveryDtype) {
  const std::vector<float> f = {1.5f, -0.0f, std::numeric_limits<float>::quiet_NaN(),
                                std::numeric_limits<float>::infinity(), 1e-45f, 3.4e38f};
  const std::vector<double> d = {0.1, -2.5e-300, 7.0};
  const std::vector<int64_t> i = {-1, 0, std::numeric_limits<int64_t>::max()};
  write_safetensors(path("a.safetensors"),
                    {{"w/f", StDtype::kF32, {2, 3}, f.data()},
                     {"d", StDtype::kF64, {3}, d.data()},
                     {"step", StDtype::kI64, {3}, i.data()},
                     {"empty", StDtype::kF32, {0, 4}, nullptr},
                     {"scalar", StDtype::kF64, {}, d.data()}},
                    {{"note", "x"}});
  SafetensorsReader r(path("a.safetensors"));
  ASSERT_EQ(r.tensors().size(), 5u);
  EXPECT_EQ(r.metadata().at("note"), "x");
  EXPECT_EQ(r.info("w/f").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_TRUE(testing_util::same_bits(r.read_f32("w/f"), f));
  const std::vector<double> d2 = r.read_f64("d");
  ASSERT_EQ(d2.size(), d.size());
  for (size_t k = 0; k < d.size(); ++k) EXPECT_EQ(std::memcmp(&d2[k], &d[k], sizeof(double)), 0);
  EXPECT_EQ(r.read_i64("step"), i);
  EXPECT_TRUE(r.read_f32("empty").empty());
  EXPECT_EQ(r.read_f64("scalar"), std::vector<double>{0.1});
  // F64 -> F32 rounds once; F32 -> F64 is exact.
  EXPECT_EQ(r.read_f32("d")[0], 0.1f);
  EXPECT_EQ(r.read_f64("w/f")[0], 1.5);
}

// Every encoding of the precision table (each row but fp32) is written under its row's dtype at
// the row's bytes per element and read back by read_encodings one per uint16_t, the low byte
// first (little-endian, as the format stores it); another dtype or fp32 is refused.
TEST_F(SafetensorsTest, EncodingsOfEveryPrecisionRowRoundTrip) {
  const std::vector<unsigned char> raw = {0x01, 0x80, 0xff, 0x7f, 0x00, 0x3c, 0xc0, 0x7e};
  int rows = 0;
  for (const PrecisionRow& row : kPrecisionRows) {
    if (row.value == Precision::kFp32) continue;
    ++rows;
    const size_t n = raw.size() / row.bytes;
    const std::string file = path(std::string(row.name) + ".safetensors");
    write_safetensors(file, {{"c/w", st_dtype_of(row.value), {static_cast<int64_t>(n)}, raw.data()}});
    const SafetensorsReader r(file);
    EXPECT_STREQ(st_dtype_name(r.info("c/w").dtype), row.safetensors);
    std::vector<uint16_t> want(n);
    for (size_t i = 0; i < n; ++i) {
      want[i] = raw[i * row.bytes];
      if (row.bytes == 2) want[i] = static_cast<uint16_t>(want[i] | raw[i * row.bytes + 1] << 8);
    }
    EXPECT_EQ(r.read_encodings("c/w", row.value), want) << row.name;
    expect_error([&] { r.read_encodings("c/w", Precision::kFp32); }, ErrorKind::kInvalidArgument, {"fp32"});
    for (const PrecisionRow& other : kPrecisionRows) {
      if (other.value == row.value || other.value == Precision::kFp32) continue;
      expect_error([&] { r.read_encodings("c/w", other.value); }, ErrorKind::kFormat,
                   {"'c/w'", row.safetensors, other.safetensors});
    }
  }
  EXPECT_GE(rows, 2);  // bf16 and fp16 at least
}

TEST_F(SafetensorsTest, DataSectionIsAligned) {
  const float x = 1.0f;
  write_safetensors(path("a.safetensors"), {{"x", StDtype::kF32, {1}, &x}});
  std::ifstream in(path("a.safetensors"), std::ios::binary);
  unsigned char len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  EXPECT_EQ(len[0] % 8, 0);
}

TEST_F(SafetensorsTest, WriteIsAtomicAndLeavesNoTemporary) {
  const float x = 2.0f;
  write_safetensors(path("out.safetensors"), {{"x", StDtype::kF32, {1}, &x}});
  // A failing write (duplicate names) keeps the old file intact and leaves nothing behind.
  EXPECT_THROW(write_safetensors(path("out.safetensors"), {{"x", StDtype::kF32, {1}, &x}, {"x", StDtype::kF32, {1}, &x}}),
               Error);
  EXPECT_EQ(SafetensorsReader(path("out.safetensors")).read_f32("x"), std::vector<float>{2.0f});
  // Into a missing folder: an I/O error naming the path, no file.
  expect_error([&] { write_safetensors(path("no/such/out.safetensors"), {{"x", StDtype::kF32, {1}, &x}}); },
               ErrorKind::kIo, {"no/such/out.safetensors"});
  const std::string listing = dir_;
  int files = 0;
  for (const char* name : {"out.safetensors"}) files += ::access(path(name).c_str(), F_OK) == 0;
  EXPECT_EQ(files, 1);
  EXPECT_NE(std::system(("ls '" + dir_ + "' | grep -q tmp").c_str()), 0) << "a temporary file was left behind";
}

// A failure of any file-system operation of the write (create, write, fsync, close, rename):
// an I/O error, the previous file intact under the final name, no temporary file left.
TEST_F(SafetensorsTest, FailedWriteAtEveryOperationKeepsThePreviousFile) {
  const float old_value = 2.0f, new_value[4] = {5.0f, 6.0f, 7.0f, 8.0f};
  write_safetensors(path("out.safetensors"), {{"x", StDtype::kF32, {1}, &old_value}});
  const int operations = checkpoint_testing::last_save_operations();
  ASSERT_GE(operations, 5);  // create, at least one write, fsync, close, rename, ...
  const int rename_op = checkpoint_testing::last_save_rename_operation();
  for (int op = 1; op <= rename_op; ++op) {
    SCOPED_TRACE("failing operation " + std::to_string(op));
    checkpoint_testing::inject_fault(op, ENOSPC);
    expect_error([&] { write_safetensors(path("out.safetensors"), {{"y", StDtype::kF32, {4}, new_value}}); },
                 ErrorKind::kIo, {"out.safetensors", std::strerror(ENOSPC)});
    checkpoint_testing::inject_fault(0, 0);
    EXPECT_EQ(SafetensorsReader(path("out.safetensors")).read_f32("x"), std::vector<float>{2.0f});
    EXPECT_NE(std::system(("ls -a '" + dir_ + "' | grep -q tmp").c_str()), 0) << "a temporary file was left behind";
  }
}

TEST_F(SafetensorsTest, WriterRejectsUnsupportedDtype) {
  const float x = 0;
  expect_error([&] { write_safetensors(path("a.safetensors"), {{"x", StDtype::kI16, {1}, &x}}); },
               ErrorKind::kInvalidArgument, {"'x'", "I16"});
  EXPECT_NE(::access(path("a.safetensors").c_str(), F_OK), 0);
}

TEST_F(SafetensorsTest, MissingFileIsIoError) {
  expect_error([&] { SafetensorsReader r(path("none.safetensors")); }, ErrorKind::kIo, {"none.safetensors"});
}

TEST_F(SafetensorsTest, FileShorterThanLengthField) {
  write_raw(path("a.safetensors"), "abc");
  expect_error([&] { SafetensorsReader r(path("a.safetensors")); }, ErrorKind::kFormat, {"a.safetensors", "truncated"});
}

TEST_F(SafetensorsTest, HeaderLengthPastEndOfFile) {
  std::string b = file_bytes("{}", 0);
  b[0] = 100;  // claims 100 header bytes, has 2
  write_raw(path("a.safetensors"), b);
  expect_error([&] { SafetensorsReader r(path("a.safetensors")); }, ErrorKind::kFormat, {"a.safetensors", "past the end"});
}

TEST_F(SafetensorsTest, HugeHeaderLengthIsRejectedBeforeAllocating) {
  std::string b = file_bytes("{}", 0);
  b[5] = 1;  // 2^40 bytes
  write_raw(path("a.safetensors"), b);
  expect_error([&] { SafetensorsReader r(path("a.safetensors")); }, ErrorKind::kFormat, {"a.safetensors", "maximum"});
}

TEST_F(SafetensorsTest, InvalidJsonHeader) {
  expect_open_refused("{not json", 0, {"a.safetensors", "JSON"});
}

TEST_F(SafetensorsTest, HeaderNotAnObject) {
  expect_open_refused("[1, 2]", 0, {"a.safetensors", "object"});
}

TEST_F(SafetensorsTest, UnknownDtype) {
  expect_open_refused(R"({"w":{"dtype":"Q7","shape":[1],"data_offsets":[0,4]}})", 4, {"'w'", "Q7"});
}

TEST_F(SafetensorsTest, KnownButUnconvertedDtypeFailsOnRead) {
  write_raw(path("a.safetensors"), file_bytes(R"({"w":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})", 4));
  SafetensorsReader r(path("a.safetensors"));
  expect_error([&] { r.read_f32("w"); }, ErrorKind::kFormat, {"'w'", "I32"});
}

TEST_F(SafetensorsTest, ShapeDoesNotMatchByteRange) {
  expect_open_refused(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,16]}})", 16, {"'w'", "24 bytes"});
}

TEST_F(SafetensorsTest, OffsetsPastEndOfData) {
  expect_open_refused(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8, {"'w'", "past the end"});
}

TEST_F(SafetensorsTest, OffsetsReversed) {
  expect_open_refused(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8, {"'w'", "begin > end"});
}

TEST_F(SafetensorsTest, OverlappingTensors) {
  write_raw(path("a.safetensors"),
            file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12));
  expect_error([&] { SafetensorsReader r(path("a.safetensors")); }, ErrorKind::kFormat, {"overlaps"});
}

TEST_F(SafetensorsTest, ShapeOverflow) {
  write_raw(path("a.safetensors"),
            file_bytes(R"({"w":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8));
  expect_error([&] { SafetensorsReader r(path("a.safetensors")); }, ErrorKind::kFormat, {"'w'", "overflow"});
}

TEST_F(SafetensorsTest, NegativeOrFractionalNumbers) {
  expect_open_refused(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4, {"'w'", "shape"});
  write_raw(path("b.safetensors"), file_bytes(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0.0,4]}})", 4));
  expect_error([&] { SafetensorsReader r(path("b.safetensors")); }, ErrorKind::kFormat, {"'w'", "data_offsets"});
}

TEST_F(SafetensorsTest, MissingAndUnknownKeys) {
  expect_open_refused(R"({"w":{"dtype":"F32","shape":[1]}})", 4, {"'w'", "data_offsets"});
  write_raw(path("b.safetensors"), file_bytes(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})", 4));
  expect_error([&] { SafetensorsReader r(path("b.safetensors")); }, ErrorKind::kFormat, {"'w'", "'x'"});
}

TEST_F(SafetensorsTest, MissingTensorIsNamed) {
  const float x = 1;
  write_safetensors(path("a.safetensors"), {{"x", StDtype::kF32, {1}, &x}});
  SafetensorsReader r(path("a.safetensors"), "init.safetensors");
  expect_error([&] { r.read_f32("y"); }, ErrorKind::kFormat, {"init.safetensors", "'y'"});
}

TEST_F(SafetensorsTest, FileTruncatedAfterValidationIsIoError) {
  const std::vector<float> x(64, 1.0f);
  write_safetensors(path("a.safetensors"), {{"x", StDtype::kF32, {64}, x.data()}});
  SafetensorsReader r(path("a.safetensors"));
  ASSERT_EQ(::truncate(path("a.safetensors").c_str(), 40), 0);
  expect_error([&] { r.read_f32("x"); }, ErrorKind::kIo, {"'x'"});
}

}  // namespace
}  // namespace renaissance
