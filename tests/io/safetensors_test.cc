// framework/io/safetensors.h: every dtype bit-exact, interoperable with the python package both
// ways, and robust against damaged files (truncated, corrupted, malformed or edited headers,
// changed data): every failure a keel::Error naming the file.
#include "framework/io/safetensors.h"

#include <gflags/gflags.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "framework/error.h"
#include "framework/io/atomic_file.h"
#include "tests/util/files.h"

DECLARE_bool(safetensors_allow_unverified);

namespace keel {
namespace {

namespace fs = std::filesystem;
using testing::MakeTensor;
using testing::TensorBytes;
using testing::WriteText;

class IoTest : public testing::TempDirTest {};

// A safetensors file from a literal header and data buffer (no padding, as a foreign writer might).
std::string MakeSafetensors(const std::string& header, const std::string& data) {
  uint64_t n = header.size();
  std::string out(reinterpret_cast<const char*>(&n), 8);
  return out + header + data;
}

// Expects loading `bytes` from a file to fail with a keel::Error naming the file and `needle`.
void ExpectLoadError(const std::string& path, const std::string& bytes, const std::string& needle) {
  SCOPED_TRACE("file " + path + " expecting '" + needle + "'");
  WriteText(path, bytes);
  try {
    LoadSafetensors(path);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.rfind(path, 0), 0u) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  }
}

// The tensors both interop tests agree on; kPythonTensors below builds the same values in numpy.
NamedTensors InteropTensors(bool with_bf16) {
  NamedTensors ts;
  std::vector<float> f32(12);
  for (int i = 0; i < 12; ++i) f32[i] = i * 0.5f - 1.0f;
  ts.emplace_back("f32", MakeTensor(DType::kFloat32, {3, 4}, f32));
  std::vector<double> f64(5);
  for (int i = 0; i < 5; ++i) f64[i] = i / 3.0;
  ts.emplace_back("f64", MakeTensor(DType::kFloat64, {5}, f64));
  ts.emplace_back("i32", MakeTensor<int32_t>(DType::kInt32, {2, 3}, {-3, -2, -1, 0, 1, 2}));
  ts.emplace_back("i64", MakeTensor<int64_t>(DType::kInt64, {4},
                                             {std::numeric_limits<int64_t>::min(), -1, 0,
                                              std::numeric_limits<int64_t>::max()}));
  ts.emplace_back("bool", MakeTensor<uint8_t>(DType::kBool, {3}, {1, 0, 1}));
  ts.emplace_back("f16", MakeTensor<uint16_t>(DType::kFloat16, {2, 3},
                                              {0x3C00, 0xC000, 0x7C00, 0x0001, 0x8000, 0x3555}));
  ts.emplace_back("u8", MakeTensor<uint8_t>(DType::kUInt8, {4}, {0, 255, 128, 7}));
  ts.emplace_back("i8", MakeTensor<int8_t>(DType::kInt8, {4}, {-128, 127, -1, 0}));
  ts.emplace_back("scalar", MakeTensor<float>(DType::kFloat32, DDim{}, {3.5f}));
  ts.emplace_back("empty", Tensor(DType::kFloat32, {0, 4}));
  // A view 5 elements into a larger allocation: values 5..10.
  std::vector<float> big(20);
  for (int i = 0; i < 20; ++i) big[i] = static_cast<float>(i);
  ts.emplace_back("view", MakeTensor(DType::kFloat32, {20}, big).View({2, 3}, 5));
  if (with_bf16)
    ts.emplace_back(
        "bf16", MakeTensor<uint16_t>(DType::kBFloat16, {2, 2}, {0x3F80, 0xC000, 0x7F80, 0x0001}));
  return ts;
}

const char* kPythonTensors = R"PY(
import sys
import numpy as np
exp = {
    "f32": np.arange(12, dtype=np.float32).reshape(3, 4) * np.float32(0.5) - np.float32(1),
    "f64": np.arange(5, dtype=np.float64) / 3.0,
    "i32": np.arange(-3, 3, dtype=np.int32).reshape(2, 3),
    "i64": np.array([-2**63, -1, 0, 2**63 - 1], dtype=np.int64),
    "bool": np.array([True, False, True]),
    "f16": np.array([0x3C00, 0xC000, 0x7C00, 0x0001, 0x8000, 0x3555], dtype=np.uint16)
              .view(np.float16).reshape(2, 3),
    "u8": np.array([0, 255, 128, 7], dtype=np.uint8),
    "i8": np.array([-128, 127, -1, 0], dtype=np.int8),
    "scalar": np.array(3.5, dtype=np.float32),
    "empty": np.zeros((0, 4), dtype=np.float32),
    "view": np.arange(5, 11, dtype=np.float32).reshape(2, 3),
}
)PY";

bool HavePythonSafetensors() {
  return std::system("/usr/bin/env python3 -c 'import safetensors, numpy' >/dev/null 2>&1") == 0;
}

// Runs a python script; returns its exit status, with stdout+stderr in *output.
int RunPython(const std::string& script_path, const std::string& script, const std::string& arg,
              std::string* output) {
  WriteText(script_path, script);
  std::string cmd = "/usr/bin/env python3 '" + script_path + "' '" + arg + "' 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) output->append(buf, n);
  return pclose(p);
}

TEST_F(IoTest, SafetensorsRoundTripsEveryDtypeBitExactly) {
  std::mt19937_64 rng(7);
  NamedTensors in;
  const DType all[] = {DType::kFloat32,  DType::kFloat64, DType::kInt32,
                       DType::kInt64,    DType::kBool,    DType::kFloat16,
                       DType::kBFloat16, DType::kUInt8,   DType::kInt8};
  for (DType dt : all) {
    // Random bit patterns (NaN payloads, -0, subnormals included) in a larger allocation, saved
    // through a view that starts at an odd element offset.
    Tensor big(dt, {64});
    auto* p = static_cast<unsigned char*>(big.raw_data());
    for (size_t i = 0; i < big.nbytes(); ++i)
      p[i] = dt == DType::kBool ? rng() % 2 : static_cast<unsigned char>(rng());
    in.emplace_back(std::string("view_") + DTypeName(dt), big.View({3, 5}, 7));
    in.emplace_back(std::string("whole_") + DTypeName(dt), big);
  }
  in.emplace_back("scalar", MakeTensor<double>(DType::kFloat64, DDim{}, {-0.0}));
  in.emplace_back("empty", Tensor(DType::kInt64, {2, 0, 3}));
  in.emplace_back("nan", MakeTensor<float>(DType::kFloat32, {2}, {std::nanf("0x123"), -INFINITY}));
  const std::map<std::string, std::string> meta = {
      {"format", "keel"},
      {"quote\"back\\slash", "line\nbreak\ttab \x01 h\xc3\xa9llo \xe2\x82\xac"}};

  const std::string path = Path("all.safetensors");
  SaveSafetensors(path, in, meta);
  std::map<std::string, std::string> meta_out;
  NamedTensors out = LoadSafetensors(path, &meta_out);
  EXPECT_EQ(meta_out, meta);

  ASSERT_EQ(out.size(), in.size());
  std::map<std::string, const Tensor*> by_name;
  for (const auto& nt : out) by_name[nt.first] = &nt.second;
  for (const auto& [name, t] : in) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(by_name.count(name));
    const Tensor& got = *by_name[name];
    EXPECT_EQ(got.dtype(), t.dtype());
    EXPECT_EQ(got.dims(), t.dims());
    EXPECT_TRUE(got.place().is_cpu());
    EXPECT_EQ(TensorBytes(got), TensorBytes(t));
  }

  // The header is space-padded so the data buffer starts 8-aligned.
  std::string bytes = ReadFile(path);
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
}

TEST_F(IoTest, SafetensorsEncodeRejectsUninitializedAndDuplicateTensors) {
  EXPECT_THROW(EncodeSafetensors({{"x", Tensor()}}), Error);
  Tensor t = MakeTensor<float>(DType::kFloat32, {1}, {1.f});
  EXPECT_THROW(EncodeSafetensors({{"x", t}, {"x", t}}), Error);
  EXPECT_THROW(EncodeSafetensors({{"bad\xff", t}}), Error);  // no reader would accept it
  EXPECT_THROW(EncodeSafetensors({{"x", t}}, {{"k", "\xc0\x80"}}), Error);
  try {
    SaveSafetensors(Path("bad.safetensors"), {{"x", Tensor()}});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(Path("bad.safetensors")), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("'x'"), std::string::npos);
  }
  EXPECT_FALSE(fs::exists(Path("bad.safetensors")));
}

TEST_F(IoTest, PythonSafetensorsReadsOurFile) {
  if (!HavePythonSafetensors())
    GTEST_SKIP() << "python3 with the safetensors and numpy packages is not available "
                    "(pip install safetensors numpy)";
  const std::string path = Path("ours.safetensors");
  SaveSafetensors(path, InteropTensors(/*with_bf16=*/true),
                  {{"format", "keel"}, {"note", "h\xc3\xa9llo \"q\"\n"}});
  std::string script = std::string(kPythonTensors) + R"PY(
from safetensors import safe_open
with safe_open(sys.argv[1], framework="numpy") as f:
    meta = f.metadata()
    crc = meta.pop("keel.data_crc32")
    header_crc = meta.pop("keel.header_crc32")
    assert meta == {"format": "keel", "note": "h\u00e9llo \"q\"\n"}, f.metadata()
    assert sorted(f.keys()) == sorted(list(exp) + ["bf16"]), f.keys()
    for k, v in exp.items():
        t = f.get_tensor(k)
        assert t.dtype == v.dtype and t.shape == v.shape, (k, t.dtype, t.shape)
        assert t.tobytes() == v.tobytes(), (k, t, v)
    s = f.get_slice("bf16")
    assert s.get_dtype() == "BF16" and s.get_shape() == [2, 2], (s.get_dtype(), s.get_shape())
# The checksum is zlib's CRC-32 of the data buffer (after the 8-byte length and the header).
import zlib
raw = open(sys.argv[1], "rb").read()
n = int.from_bytes(raw[:8], "little")
assert crc == "%08x" % zlib.crc32(raw[8 + n:]), (crc, "%08x" % zlib.crc32(raw[8 + n:]))
# The header checksum: CRC-32 of the other metadata entries (byte-length-prefixed, key order) and
# each tensor's name, dtype, shape and offsets (name order), from the JSON header itself.
import json
hdr = json.loads(raw[8:8 + n])
def lp(s):
    b = s.encode()
    return str(len(b)).encode() + b":" + b
text = b""
for k, v in sorted(hdr.pop("__metadata__").items(), key=lambda kv: kv[0].encode()):
    if k not in ("keel.data_crc32", "keel.header_crc32"):
        text += lp(k) + b"=" + lp(v) + b"\n"
for name, t in sorted(hdr.items(), key=lambda kv: kv[0].encode()):
    text += lp(name) + b" " + t["dtype"].encode() + b" [" + b"".join(b"%d," % d for d in t["shape"])
    text += b"] %d %d\n" % tuple(t["data_offsets"])
assert header_crc == "%08x" % zlib.crc32(text), (header_crc, "%08x" % zlib.crc32(text), text)
print("OK")
)PY";
  std::string output;
  int rc = RunPython(Path("check.py"), script, path, &output);
  EXPECT_EQ(rc, 0) << output;
  EXPECT_NE(output.find("OK"), std::string::npos) << output;
}

TEST_F(IoTest, WeReadPythonSafetensorsFile) {
  if (!HavePythonSafetensors())
    GTEST_SKIP() << "python3 with the safetensors and numpy packages is not available "
                    "(pip install safetensors numpy)";
  const std::string path = Path("theirs.safetensors");
  std::string script = std::string(kPythonTensors) + R"PY(
from safetensors.numpy import save_file
save_file(exp, sys.argv[1], metadata={"src": "python"})
)PY";
  std::string output;
  ASSERT_EQ(RunPython(Path("write.py"), script, path, &output), 0) << output;

  std::map<std::string, std::string> meta;
  NamedTensors got = LoadSafetensors(path, &meta);
  EXPECT_EQ(meta, (std::map<std::string, std::string>{{"src", "python"}}));
  std::map<std::string, const Tensor*> by_name;
  for (const auto& nt : got) by_name[nt.first] = &nt.second;
  NamedTensors want = InteropTensors(/*with_bf16=*/false);
  EXPECT_EQ(got.size(), want.size());
  for (const auto& [name, t] : want) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(by_name.count(name));
    EXPECT_EQ(by_name[name]->dtype(), t.dtype());
    EXPECT_EQ(by_name[name]->dims(), t.dims());
    EXPECT_EQ(TensorBytes(*by_name[name]), TensorBytes(t));
  }
}

TEST_F(IoTest, EveryTruncationOfAFileIsAnErrorNamingIt) {
  std::string bytes = EncodeSafetensors({{"a", MakeTensor<float>(DType::kFloat32, {2}, {1.f, 2.f})},
                                         {"b", MakeTensor<uint8_t>(DType::kUInt8, {3}, {1, 2, 3})}},
                                        {{"k", "v"}});
  const std::string path = Path("trunc.safetensors");
  for (size_t len = 0; len < bytes.size(); ++len) {
    SCOPED_TRACE("prefix length " + std::to_string(len) + " of " + std::to_string(bytes.size()));
    WriteText(path, bytes.substr(0, len));
    try {
      LoadSafetensors(path);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind(path, 0), 0u) << e.what();
    }
  }
}

TEST_F(IoTest, CorruptedBytesNeverCrash) {
  // Every header byte set to a handful of values: decoding succeeds or throws keel::Error.
  std::string bytes =
      EncodeSafetensors({{"w", MakeTensor<int32_t>(DType::kInt32, {2, 2}, {1, 2, 3, 4})},
                         {"z", MakeTensor<uint8_t>(DType::kBool, {2}, {0, 1})}},
                        {{"m", "x"}});
  int errors = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (unsigned char v : {0x00, 0x01, 0x22, 0x2c, 0x30, 0x39, 0x5b, 0x5d, 0x7b, 0x7d, 0xff}) {
      std::string b = bytes;
      b[i] = static_cast<char>(v);
      try {
        DecodeSafetensors(b, "fuzz");
      } catch (const Error& e) {
        EXPECT_EQ(std::string(e.what()).rfind("fuzz", 0), 0u) << e.what();
        ++errors;
      }
    }
  }
  EXPECT_GT(errors, 0);
}

TEST_F(IoTest, BadHeaderLengthIsAnError) {
  const std::string good = MakeSafetensors(
      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0'));
  std::string huge = good;
  uint64_t big = 1ull << 62;
  std::memcpy(&huge[0], &big, 8);
  ExpectLoadError(Path("huge.safetensors"), huge, "exceeds the limit");
  std::string longer = good;
  uint64_t past = good.size();  // header "ends" past the end of the file
  std::memcpy(&longer[0], &past, 8);
  ExpectLoadError(Path("longer.safetensors"), longer, "exceeds the file size");
  std::string zero = good;
  uint64_t z = 0;
  std::memcpy(&zero[0], &z, 8);
  ExpectLoadError(Path("zero.safetensors"), zero, "does not start with '{'");
  ExpectLoadError(Path("tiny.safetensors"), "abc", "shorter than");
  ExpectLoadError(Path("empty.safetensors"), "", "shorter than");
}

TEST_F(IoTest, MalformedHeadersAreErrorsNamingTheFile) {
  const std::string d4(4, '\0'), d8(8, '\0'), d12(12, '\0');
  struct Case {
    const char* name;
    std::string header, data, needle;
  };
  const std::vector<Case> cases = {
      {"garbage", "{not json}", "", "bad safetensors header"},
      {"unterminated", R"({"a":{"dtype":"F32")", "", "bad safetensors header"},
      {"top_level_array", "[1]", "", "does not start with '{'"},
      {"unclosed_object", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})", d4,
       "bad safetensors header"},
      {"trailing", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}} x)", d4,
       "trailing characters"},
      {"duplicate_name",
       R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
       d8, "duplicate key"},
      {"deep",
       std::string(1, '{') + "\"a\":" + std::string(5000, '[') + std::string(5000, ']') + "}", "",
       "nesting deeper"},
      {"bad_escape", R"({"a\q":{}})", "", "invalid escape"},
      {"bad_utf8", "{\"a\xff\":{}}", "", "invalid UTF-8"},
      {"wrong_dtype", R"({"a":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}})", d4,
       "F8_E4M3"},
      {"lowercase_dtype", R"({"a":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}})", d4,
       "does not support"},
      {"dtype_not_string", R"({"a":{"dtype":1,"shape":[1],"data_offsets":[0,4]}})", d4,
       "dtype must be a string"},
      {"missing_field", R"({"a":{"dtype":"F32","shape":[1]}})", d4, "needs"},
      {"unknown_field", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})", d4,
       "unknown field"},
      {"negative_dim", R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", d4,
       "non-negative integer"},
      {"fractional_dim", R"({"a":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}})", d4,
       "non-negative integer"},
      {"huge_dim", R"({"a":{"dtype":"F32","shape":[99999999999999999999],"data_offsets":[0,4]}})",
       d4, "too large"},
      {"numel_overflow",
       R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,4]}})",
       d4, "more than 2^64"},
      {"rank_too_high",
       R"({"a":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}})", d4, "rank"},
      {"offsets_out_of_bounds", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", d4,
       "exceed the data buffer"},
      {"offsets_reversed", R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}})", d4,
       "begin > end"},
      {"offsets_not_pair", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", d4,
       "data_offsets must be"},
      {"overlap",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       d12, "overlap"},
      {"same_range",
       R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})",
       d4, "overlap"},
      {"shape_offset_mismatch", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", d8,
       "needs 12 bytes"},
      {"metadata_not_strings", R"({"__metadata__":{"k":1}})", "", "must be a string"},
      {"entry_not_object", R"({"a":[1,2]})", "", "must be an object"},
      {"bool_byte", R"({"a":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})",
       std::string("\x01\x02", 2), "must be 0 or 1"},
      // Offsets must tile the data buffer exactly, as the reference reader requires.
      {"gap_before_first", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", d8,
       "gap of 4 bytes at offset 0 before tensor \"a\""},
      {"gap_between",
       R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
       d12, "gap of 4 bytes at offset 4 before tensor \"b\""},
      {"bytes_after_last", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", d8,
       "holds 4 bytes after the last tensor"},
      {"bytes_without_tensors", R"({})", d4, "holds 4 bytes after the last tensor"},
      {"checksum_mismatch",
       R"({"__metadata__":{"keel.data_crc32":"00000000"},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
       d4, "does not match its checksum (keel.data_crc32 00000000 in the header, 2144df1c"},
      {"checksum_malformed",
       R"({"__metadata__":{"keel.data_crc32":"2144DF1C"},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
       d4, "not 8 lowercase hex digits"},
  };
  for (const Case& c : cases) {
    ExpectLoadError(Path(std::string(c.name) + ".safetensors"), MakeSafetensors(c.header, c.data),
                    c.needle);
  }
}

TEST_F(IoTest, ADataByteChangedOrShiftedIsCaughtByTheChecksumOrTheTiling) {
  const NamedTensors tensors = {{"w", MakeTensor<float>(DType::kFloat32, {3}, {1.f, 2.f, 3.f})},
                                {"b", MakeTensor<int64_t>(DType::kInt64, {1}, {7})}};
  const std::string good = EncodeSafetensors(tensors, {{"k", "v"}});
  std::map<std::string, std::string> meta;
  EXPECT_EQ(DecodeSafetensors(good, "good", &meta).size(), 2u);
  EXPECT_EQ(meta, (std::map<std::string, std::string>{{"k", "v"}}));  // the checksum verified
  EXPECT_NE(good.find("\"keel.data_crc32\":\""), std::string::npos);
  // A caller's stale checksum is replaced, not written.
  EXPECT_EQ(EncodeSafetensors(tensors, {{"k", "v"}, {"keel.data_crc32", "00000000"}}), good);

  const uint64_t n = static_cast<uint64_t>(static_cast<unsigned char>(good[0])) |
                     static_cast<uint64_t>(static_cast<unsigned char>(good[1])) << 8;
  for (size_t at = 8 + n; at < good.size(); ++at) {
    SCOPED_TRACE("data byte " + std::to_string(at - 8 - n));
    std::string bad = good;
    bad[at] ^= 0x10;
    ExpectLoadError(Path("flipped.safetensors"), bad, "does not match its checksum");
  }
  // Bytes slipped in between header and data: every tensor would read shifted.
  std::string shifted = good;
  shifted.insert(8 + n, std::string(4, '\0'));
  ExpectLoadError(Path("shifted.safetensors"), shifted, "after the last tensor");
}

// The header checksum: an edited training step (one digit, same length), two same-shaped
// tensors with exchanged offsets, and a deleted checksum are all errors; a deleted one loads only
// with --safetensors_allow_unverified.
TEST_F(IoTest, AnEditedHeaderOrADeletedChecksumIsCaught) {
  const NamedTensors tensors = {{"a", MakeTensor<float>(DType::kFloat32, {2}, {1.f, 2.f})},
                                {"b", MakeTensor<float>(DType::kFloat32, {2}, {3.f, 4.f})}};
  const std::map<std::string, std::string> meta = {
      {"format", "keel"}, {"keel.version", "2"}, {"keel.train.step", "12"}};
  const std::string good = EncodeSafetensors(tensors, meta);
  EXPECT_EQ(DecodeSafetensors(good, "good").size(), 2u);
  auto edit = [&](const std::string& from, const std::string& to) {
    std::string bad = good;
    const size_t at = bad.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) bad.replace(at, from.size(), to);
    EXPECT_EQ(bad.size(), good.size());
    return bad;
  };
  ExpectLoadError(Path("step.safetensors"),
                  edit("\"keel.train.step\":\"12\"", "\"keel.train.step\":\"13\""),
                  "header (metadata and tensor table) does not match its checksum");
  // "a" holds [0,8], "b" [8,16] (in that order in the header): exchanged, each would load the
  // other's values, and the tensors still tile the buffer.
  const size_t pa = good.find("[0,8]"), pb = good.find("[8,16]");
  ASSERT_LT(pa, pb);
  const std::string swapped = good.substr(0, pa) + "[8,16]" + good.substr(pa + 5, pb - pa - 5) +
                              "[0,8]" + good.substr(pb + 6);
  ASSERT_EQ(swapped.size(), good.size());
  ExpectLoadError(Path("swapped.safetensors"), swapped,
                  "header (metadata and tensor table) does not match its checksum");
  // The checksums deleted (blanked to spaces, which JSON allows): refused unless asked.
  for (const std::string key : {"keel.data_crc32", "keel.header_crc32"}) {
    SCOPED_TRACE(key);
    std::string bad = good;
    const size_t at = bad.find(",\"" + key + "\":\"");
    ASSERT_NE(at, std::string::npos);
    bad.replace(at, key.size() + 14, std::string(key.size() + 14, ' '));  // ,"key":"8 hex"
    ASSERT_EQ(bad.size(), good.size());
    ExpectLoadError(Path("deleted.safetensors"), bad, "--safetensors_allow_unverified");
    gflags::FlagSaver saver;
    FLAGS_safetensors_allow_unverified = true;
    EXPECT_EQ(DecodeSafetensors(bad, "allowed").size(), 2u);
  }
}

TEST_F(IoTest, ForeignLayoutsDecode) {
  // Unpadded header, whitespace, escapes, empty tensors sharing an offset, no checksum.
  const std::string header =
      "{\n \"__metadata__\" : {\"k\":\"\\u00e9\\ud83d\\ude00\"},\n"
      " \"e1\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},\n"
      " \"e2\":{\"dtype\":\"I8\",\"shape\":[3,0],\"data_offsets\":[4,4]},\n"
      " \"a\\/b\":{\"shape\":[1],\"data_offsets\":[0,4],\"dtype\":\"I32\"}}";
  std::string data("\x2a\0\0\0", 4);
  std::map<std::string, std::string> meta;
  NamedTensors got = DecodeSafetensors(MakeSafetensors(header, data), "foreign", &meta);
  EXPECT_EQ(meta.at("k"), "\xc3\xa9\xf0\x9f\x98\x80");
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].first, "a/b");
  EXPECT_EQ(got[0].second.data<int32_t>()[0], 42);
  EXPECT_EQ(got[1].second.dims(), DDim({0}));
  EXPECT_EQ(got[2].second.dims(), DDim({3, 0}));
}
}  // namespace
}  // namespace keel
