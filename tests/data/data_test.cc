// framework/data: gzip, the MNIST/CSV/synthetic datasets (real files and damaged ones) and the
// DataLoader (batching, shuffling, sharding, prefetch order, errors, shutdown).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>

#include "framework/data/csv_dataset.h"
#include "framework/data/data_loader.h"
#include "framework/data/gzip.h"
#include "framework/data/mnist_dataset.h"
#include "models/mlp/mlp_model.h"
#include "tests/util/op_test_util.h"
#include "tests/util/test_data.h"

namespace keel {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------- helpers

// What a call threw: the keel::Error's message, or a marker that makes any substring check fail.
using testing::ErrorOf;

#define EXPECT_ERROR_WITH(stmt, ...)                                                        \
  do {                                                                                      \
    const std::string msg_ = ErrorOf([&] { stmt; });                                        \
    EXPECT_EQ(msg_.find(testing::kNotAKeelError), std::string::npos) << msg_;               \
    EXPECT_FALSE(msg_.empty()) << "no error from " << #stmt;                                \
    for (const std::string& sub_ : std::vector<std::string>{__VA_ARGS__})                   \
      EXPECT_NE(msg_.find(sub_), std::string::npos) << "'" << sub_ << "' not in: " << msg_; \
  } while (0)

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/keel_data_test.XXXXXX";
    if (mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
  }
  ~TempDir() { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  std::string Write(const std::string& name, const std::string& bytes) const {
    std::ofstream(Path(name), std::ios::binary) << bytes;
    return Path(name);
  }

 private:
  std::string dir_;
};

std::string BigEndian32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
          static_cast<char>(v)};
}

// An IDX3 images file of `count` images of rows x cols; pixel (i, j) of image n is n + j.
std::string IdxImages(uint32_t count, uint32_t rows, uint32_t cols, uint32_t magic = 2051) {
  std::string s = BigEndian32(magic) + BigEndian32(count) + BigEndian32(rows) + BigEndian32(cols);
  for (uint32_t n = 0; n < count; ++n)
    for (uint32_t p = 0; p < rows * cols; ++p) s += static_cast<char>((n * 40 + p) % 256);
  return s;
}

std::string IdxLabels(const std::vector<uint8_t>& labels, uint32_t magic = 2049) {
  std::string s = BigEndian32(magic) + BigEndian32(static_cast<uint32_t>(labels.size()));
  for (uint8_t l : labels) s += static_cast<char>(l);
  return s;
}

using keel::testing::HaveMnist;
using keel::testing::MnistDir;

#define SKIP_WITHOUT_MNIST() \
  if (HaveMnist()) {         \
  } else                     \
    GTEST_SKIP() << "MNIST test set not found in " << MnistDir() << " (set KEEL_MNIST_DIR)"

template <typename T>
std::vector<T> Values(const Tensor& t) {
  return std::vector<T>(t.data<T>(), t.data<T>() + t.numel());
}

// LoaderOptions spelled fluently: Opts(4).Shuffle(seed).Workers(3).Rank(1, 2).
struct Opts : LoaderOptions {
  explicit Opts(int64_t batch) { batch_size = batch; }
  Opts& Shuffle(uint64_t s) {
    shuffle = true;
    seed = s;
    return *this;
  }
  Opts& DropLast(bool d) {
    drop_last = d;
    return *this;
  }
  Opts& Workers(int w, int capacity = 4) {
    num_workers = w;
    queue_capacity = capacity;
    return *this;
  }
  Opts& Rank(int r, int n) {
    rank = r;
    nranks = n;
    return *this;
  }
};

// ---------------------------------------------------------------- gzip

TEST(Gzip, RoundTripsAndJoinsConcatenatedMembers) {
  std::mt19937 rng(3);
  for (size_t n : {0, 1, 1000, 300000}) {
    std::string bytes(n, '\0');
    for (char& c : bytes) c = static_cast<char>(rng() % 7);  // compressible
    const std::string gz = GzipBytes(bytes);
    EXPECT_TRUE(IsGzip(gz));
    EXPECT_EQ(GunzipBytes(gz, "mem"), bytes) << n;
    EXPECT_EQ(GunzipBytes(gz + GzipBytes("tail"), "mem"), bytes + "tail") << n;
  }
}

TEST(Gzip, EveryTruncationIsAnErrorNamingTheFile) {
  const std::string gz = GzipBytes(IdxImages(3, 4, 5));
  for (size_t len = 0; len < gz.size(); ++len) {
    SCOPED_TRACE(len);
    EXPECT_ERROR_WITH(GunzipBytes(gz.substr(0, len), "some/file.gz"), "some/file.gz");
  }
}

TEST(Gzip, EveryCorruptedByteAfterTheHeaderIsAnError) {
  const std::string gz = GzipBytes(IdxImages(3, 4, 5));
  // Bytes 0..9 are the fixed header (magic, method, flags, mtime, xfl, os); after them come the
  // deflate data and the CRC-32/length trailer, which zlib checks.
  for (size_t i = 10; i < gz.size(); ++i) {
    SCOPED_TRACE(i);
    std::string bad = gz;
    bad[i] = static_cast<char>(bad[i] ^ 0xff);
    EXPECT_ERROR_WITH(GunzipBytes(bad, "x.gz"), "x.gz");
  }
}

TEST(Gzip, TrailingGarbageIsAnError) {
  EXPECT_ERROR_WITH(GunzipBytes(GzipBytes("abc") + "junk", "x.gz"), "x.gz", "trailing");
}

TEST(Gzip, MissingFileIsAnErrorNamingIt) {
  EXPECT_ERROR_WITH(ReadFileBytes("/nonexistent/keel/file.idx"), "/nonexistent/keel/file.idx");
}

// ---------------------------------------------------------------- MNIST, real files

TEST(Mnist, RealTestSetHas10000PlausibleExamples) {
  SKIP_WITHOUT_MNIST();
  MnistDataset ds(MnistDir() + "/t10k-images-idx3-ubyte.gz",
                  MnistDir() + "/t10k-labels-idx1-ubyte.gz");
  ASSERT_EQ(ds.size(), 10000);
  EXPECT_EQ(ds.file_count(), 10000);
  EXPECT_EQ(ds.rows(), 28);
  EXPECT_EQ(ds.cols(), 28);
  EXPECT_EQ(ds.names(), (std::vector<std::string>{"image", "label"}));
  std::map<int64_t, int> histogram;
  float lo = 1, hi = 0;
  for (int64_t i = 0; i < ds.size(); ++i) {
    Example ex = ds.Get(i);
    ASSERT_EQ(ex.size(), 2u);
    ASSERT_EQ(ex[0].dims(), (DDim{1, 28, 28}));
    ASSERT_EQ(ex[0].dtype(), DType::kFloat32);
    ASSERT_EQ(ex[1].dims(), (DDim{1}));
    ASSERT_EQ(ex[1].dtype(), DType::kInt64);
    ++histogram[ex[1].data<int64_t>()[0]];
    const float* p = ex[0].data<float>();
    lo = std::min(lo, *std::min_element(p, p + 784));
    hi = std::max(hi, *std::max_element(p, p + 784));
  }
  EXPECT_EQ(lo, 0.0f);
  EXPECT_EQ(hi, 1.0f);
  ASSERT_EQ(histogram.size(), 10u);
  for (auto& [digit, count] : histogram) {
    EXPECT_TRUE(0 <= digit && digit <= 9);
    EXPECT_GE(count, 800) << digit;
    EXPECT_LE(count, 1300) << digit;
  }
  // The well-known first test labels: 7 2 1 0 4.
  for (int i = 0; i < 5; ++i) EXPECT_EQ(ds.label(i), (std::vector<int>{7, 2, 1, 0, 4})[i]);
}

TEST(Mnist, SplitsSelectTheFirst8000AndTheLast2000) {
  SKIP_WITHOUT_MNIST();
  const std::string images = MnistDir() + "/t10k-images-idx3-ubyte.gz";
  const std::string labels = MnistDir() + "/t10k-labels-idx1-ubyte.gz";
  MnistDataset all(images, labels), train(images, labels, 0, 8000), test(images, labels, 8000);
  EXPECT_EQ(train.size(), 8000);
  EXPECT_EQ(test.size(), 2000);
  for (int64_t i : {0, 1, 1999}) {
    EXPECT_EQ(Values<float>(test.Get(i)[0]), Values<float>(all.Get(8000 + i)[0])) << i;
    EXPECT_EQ(test.label(i), all.label(8000 + i));
  }
  EXPECT_EQ(Values<float>(train.Get(7999)[0]), Values<float>(all.Get(7999)[0]));
  EXPECT_ERROR_WITH(MnistDataset(images, labels, 0, 10001), images, "range");
  EXPECT_ERROR_WITH(MnistDataset(images, labels, 5, 3), images, "range");
  EXPECT_ERROR_WITH(train.Get(8000), "index 8000");
}

TEST(Mnist, GzippedAndRawFilesReadTheSame) {
  SKIP_WITHOUT_MNIST();
  TempDir tmp;
  const std::string gz_images = MnistDir() + "/t10k-images-idx3-ubyte.gz";
  const std::string gz_labels = MnistDir() + "/t10k-labels-idx1-ubyte.gz";
  const std::string raw_images =
      tmp.Write("images-idx3-ubyte", GunzipBytes(ReadFileBytes(gz_images), gz_images));
  const std::string raw_labels =
      tmp.Write("labels-idx1-ubyte", GunzipBytes(ReadFileBytes(gz_labels), gz_labels));
  EXPECT_EQ(fs::file_size(raw_images), 16u + 10000u * 784u);
  EXPECT_EQ(fs::file_size(raw_labels), 8u + 10000u);
  MnistDataset gz(gz_images, gz_labels), raw(raw_images, raw_labels);
  ASSERT_EQ(raw.size(), gz.size());
  for (int64_t i = 0; i < gz.size(); ++i) {
    ASSERT_EQ(raw.label(i), gz.label(i)) << i;
    if (i % 97 == 0) {
      ASSERT_EQ(Values<float>(raw.Get(i)[0]), Values<float>(gz.Get(i)[0])) << i;
    }
  }
}

TEST(Mnist, NormalizeAppliesMeanAndStd) {
  SKIP_WITHOUT_MNIST();
  const std::string images = MnistDir() + "/t10k-images-idx3-ubyte.gz";
  const std::string labels = MnistDir() + "/t10k-labels-idx1-ubyte.gz";
  MnistDataset plain(images, labels, 0, 100), norm(images, labels, 0, 100, /*normalize=*/true);
  double sum = 0;
  for (int64_t i = 0; i < 100; ++i) {
    std::vector<float> p = Values<float>(plain.Get(i)[0]), q = Values<float>(norm.Get(i)[0]);
    for (size_t k = 0; k < p.size(); ++k) {
      ASSERT_NEAR(q[k], (p[k] - 0.1307f) / 0.3081f, 1e-5) << i << " " << k;
      sum += q[k];
    }
  }
  EXPECT_NEAR(sum / (100 * 784), 0.0, 0.1);  // near zero mean, as the constants intend
}

TEST(Mnist, DamagedRealGzipIsAnErrorNamingTheFile) {
  SKIP_WITHOUT_MNIST();
  TempDir tmp;
  const std::string labels = MnistDir() + "/t10k-labels-idx1-ubyte.gz";
  std::string gz = ReadFileBytes(MnistDir() + "/t10k-images-idx3-ubyte.gz");
  const std::string cut = tmp.Write("cut.gz", gz.substr(0, gz.size() / 2));
  EXPECT_ERROR_WITH(MnistDataset(cut, labels), cut, "truncated");
  gz[gz.size() / 2] = static_cast<char>(gz[gz.size() / 2] ^ 0x55);
  const std::string flipped = tmp.Write("flipped.gz", gz);
  EXPECT_ERROR_WITH(MnistDataset(flipped, labels), flipped, "corrupt");
}

// ---------------------------------------------------------------- MNIST, hand-made files

TEST(Mnist, SmallHandMadeFilesReadBackExactly) {
  TempDir tmp;
  const std::string images = tmp.Write("i", IdxImages(3, 4, 5));
  const std::string labels = tmp.Write("l", IdxLabels({9, 0, 4}));
  MnistDataset ds(images, labels);
  ASSERT_EQ(ds.size(), 3);
  Example ex = ds.Get(2);
  EXPECT_EQ(ex[0].dims(), (DDim{1, 4, 5}));
  EXPECT_FLOAT_EQ(ex[0].data<float>()[7], (80 + 7) / 255.0f);
  EXPECT_EQ(ex[1].data<int64_t>()[0], 4);
  // The same bytes gzipped.
  MnistDataset gz(tmp.Write("i.gz", GzipBytes(IdxImages(3, 4, 5))),
                  tmp.Write("l.gz", GzipBytes(IdxLabels({9, 0, 4}))));
  EXPECT_EQ(Values<float>(gz.Get(2)[0]), Values<float>(ex[0]));
}

TEST(Mnist, WrongMagicIsAnErrorNamingTheFile) {
  TempDir tmp;
  const std::string images = tmp.Write("i", IdxImages(3, 4, 5));
  const std::string labels = tmp.Write("l", IdxLabels({1, 2, 3}));
  EXPECT_ERROR_WITH(MnistDataset(labels, images), labels, "magic number 2049", "swapped");
  const std::string bad = tmp.Write("bad", IdxImages(3, 4, 5, 0x12345678));
  EXPECT_ERROR_WITH(MnistDataset(bad, labels), bad, "magic", "2051");
  const std::string bad_labels = tmp.Write("badl", IdxLabels({1, 2, 3}, 2050));
  EXPECT_ERROR_WITH(MnistDataset(images, bad_labels), bad_labels, "magic", "2049");
}

TEST(Mnist, EveryTruncatedPrefixIsAnErrorNamingTheFile) {
  TempDir tmp;
  const std::string images = IdxImages(3, 4, 5), labels = IdxLabels({1, 2, 3});
  const std::string good_images = tmp.Write("good_i", images);
  const std::string good_labels = tmp.Write("good_l", labels);
  for (size_t len = 0; len < images.size(); ++len) {
    SCOPED_TRACE(len);
    const std::string raw = tmp.Write("i", images.substr(0, len));
    EXPECT_ERROR_WITH(MnistDataset(raw, good_labels), raw);
    const std::string gz = tmp.Write("i.gz", GzipBytes(images.substr(0, len)));
    EXPECT_ERROR_WITH(MnistDataset(gz, good_labels), gz);
  }
  for (size_t len = 0; len < labels.size(); ++len) {
    SCOPED_TRACE(len);
    const std::string raw = tmp.Write("l", labels.substr(0, len));
    EXPECT_ERROR_WITH(MnistDataset(good_images, raw), raw);
  }
}

TEST(Mnist, TrailingBytesAreAnError) {
  TempDir tmp;
  const std::string images = tmp.Write("i", IdxImages(3, 4, 5) + "x");
  const std::string labels = tmp.Write("l", IdxLabels({1, 2, 3}));
  EXPECT_ERROR_WITH(MnistDataset(images, labels), images, "trailing");
}

TEST(Mnist, CountMismatchIsAnErrorNamingBothFiles) {
  TempDir tmp;
  const std::string images = tmp.Write("i", IdxImages(3, 4, 5));
  const std::string labels = tmp.Write("l", IdxLabels({1, 2}));
  EXPECT_ERROR_WITH(MnistDataset(images, labels), images, labels, "3 images", "2 labels");
}

TEST(Mnist, LabelOutOfRangeIsAnError) {
  TempDir tmp;
  const std::string images = tmp.Write("i", IdxImages(3, 4, 5));
  const std::string labels = tmp.Write("l", IdxLabels({1, 10, 3}));
  EXPECT_ERROR_WITH(MnistDataset(images, labels), labels, "label 1 is 10");
}

TEST(Mnist, ZeroSizedImagesAreAnError) {
  TempDir tmp;
  const std::string images = tmp.Write("i", IdxImages(3, 0, 5));
  const std::string labels = tmp.Write("l", IdxLabels({1, 2, 3}));
  EXPECT_ERROR_WITH(MnistDataset(images, labels), images, "image size");
}

TEST(Mnist, HugeHeaderDimsAreAnErrorNotAnAllocation) {
  TempDir tmp;
  std::string s = BigEndian32(2051) + BigEndian32(0xffffffff) + BigEndian32(0xffffffff) +
                  BigEndian32(0xffffffff);
  const std::string images = tmp.Write("i", s);
  const std::string labels = tmp.Write("l", IdxLabels({1}));
  EXPECT_ERROR_WITH(MnistDataset(images, labels), images);
}

TEST(Mnist, CorruptGzipIsAnErrorNamingTheFile) {
  TempDir tmp;
  std::string gz = GzipBytes(IdxImages(3, 4, 5));
  gz[gz.size() - 6] = static_cast<char>(gz[gz.size() - 6] ^ 1);  // the CRC
  const std::string images = tmp.Write("i.gz", gz);
  const std::string labels = tmp.Write("l", IdxLabels({1, 2, 3}));
  EXPECT_ERROR_WITH(MnistDataset(images, labels), images, "corrupt");
}

TEST(Mnist, RandomlyDamagedFilesReadOrFailCleanly) {
  TempDir tmp;
  const std::string images = IdxImages(3, 4, 5), labels = IdxLabels({1, 2, 3});
  const std::string gz_images = GzipBytes(images);
  std::mt19937 rng(7);
  int failed = 0;
  for (int trial = 0; trial < 600; ++trial) {
    // Damage one of: raw images, gzipped images, raw labels; 1 to 3 random bytes each.
    const int which = trial % 3;
    std::string bytes = which == 0 ? images : which == 1 ? gz_images : labels;
    for (int k = 0, n = 1 + rng() % 3; k < n; ++k) bytes[rng() % bytes.size()] = char(rng());
    const std::string path = tmp.Write("damaged", bytes);
    const std::string good =
        tmp.Write(which == 2 ? "good_i" : "good_l", which == 2 ? images : labels);
    try {
      MnistDataset ds(which == 2 ? good : path, which == 2 ? path : good);
      for (int64_t i = 0; i < ds.size(); ++i) ds.Get(i);
    } catch (const Error& e) {
      ++failed;
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  }
  EXPECT_GT(failed, 100);  // most header and gzip damage is caught; pixel damage reads fine
}

TEST(Mnist, MissingFileIsAnErrorNamingIt) {
  TempDir tmp;
  const std::string labels = tmp.Write("l", IdxLabels({1, 2, 3}));
  EXPECT_ERROR_WITH(MnistDataset(tmp.Path("nope"), labels), tmp.Path("nope"));
}

// ---------------------------------------------------------------- CSV

TEST(Csv, ReadsFeaturesAndLabelByHeaderName) {
  TempDir tmp;
  const std::string text = "a, b ,label,c\n1,2,0,3\r\n 4.5 , -1e2 ,1, 0\n\n7,8,2.0,9\n";
  const std::string path = tmp.Write("t.csv", text);
  CsvDataset ds(path, "label");
  ASSERT_EQ(ds.size(), 3);
  EXPECT_EQ(ds.num_features(), 3);
  EXPECT_EQ(ds.feature_columns(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(ds.names(), (std::vector<std::string>{"features", "label"}));
  Example ex = ds.Get(1);
  EXPECT_EQ(ex[0].dims(), (DDim{3}));
  EXPECT_EQ(Values<float>(ex[0]), (std::vector<float>{4.5f, -100.0f, 0.0f}));
  EXPECT_EQ(ex[1].dims(), (DDim{1}));
  EXPECT_EQ(ex[1].data<int64_t>()[0], 1);
  EXPECT_EQ(ds.Get(2)[1].data<int64_t>()[0], 2);
  // Gzipped, with options.
  CsvOptions options;
  options.num_classes = 3;
  options.features_name = "x";
  options.label_name = "y";
  CsvDataset gz(tmp.Write("t.csv.gz", GzipBytes(text)), "label", options);
  EXPECT_EQ(gz.names(), (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(Values<float>(gz.Get(1)[0]), Values<float>(ex[0]));
}

TEST(Csv, MalformedFilesAreErrorsNamingTheLine) {
  TempDir tmp;
  struct Case {
    std::string text, want;
  };
  const std::vector<Case> cases = {
      {"a,label\n1,0\n2\n", ":3: expected 2 fields"},
      {"a,label\n1,0\n2,1,3\n", ":3: expected 2 fields"},
      {"a,label\n1,0\nabc,1\n", ":3: field 'abc' in column 'a'"},
      {"a,label\n,0\n", ":2: field ''"},
      {"a,label\nnan,0\n", ":2: field 'nan'"},
      {"a,label\n1e999,0\n", ":2: field '1e999'"},
      {"a,label\n1,1.5\n", ":2: label '1.5'"},
      {"a,label\n1,x\n", ":2: label 'x'"},
      {"a,b\n1,0\n", ":1: no label column 'label'"},
      {"label\n1\n", ":1: no feature columns"},
      {"a,a,label\n1,2,0\n", ":1: duplicate header column 'a'"},
      {"a,,label\n1,2,0\n", ":1: header column 2 has no name"},
      {"", "empty file"},
      {"\n\n", "empty file"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].text);
    const std::string path = tmp.Write("bad" + std::to_string(i) + ".csv", cases[i].text);
    EXPECT_ERROR_WITH(CsvDataset(path, "label"), path, cases[i].want);
  }
  CsvOptions options;
  options.num_classes = 2;
  const std::string path = tmp.Write("classes.csv", "a,label\n1,0\n2,2\n");
  EXPECT_ERROR_WITH(CsvDataset(path, "label", options), path + ":3: label 2 outside 0..1");
}

// ---------------------------------------------------------------- synthetic

TEST(SyntheticMlp, ReproducesTheSeedsStream) {
  models::SyntheticMlpDataset ds(100, 42);
  EXPECT_EQ(ds.names(), (std::vector<std::string>{"x", "y"}));
  Tensor x, y;
  models::SyntheticMlpData(42).Next(100, &x, &y);
  for (int64_t i = 0; i < 100; ++i) {
    Example ex = ds.Get(i);
    ASSERT_EQ(ex[0].dims(), (DDim{32}));
    std::vector<float> row = Values<float>(ex[0]);
    ASSERT_EQ(row, std::vector<float>(x.data<float>() + 32 * i, x.data<float>() + 32 * (i + 1)));
    ASSERT_EQ(ex[1].data<int64_t>()[0], y.data<int64_t>()[i]);
    float a = 0, b = 0;
    for (int k = 0; k < 16; ++k) a += row[k], b += row[16 + k];
    EXPECT_EQ(ex[1].data<int64_t>()[0], a > b ? 1 : 0);
  }
  // A loader without shuffling feeds the seed MLP the seed's batches.
  DataLoader loader(std::make_shared<models::SyntheticMlpDataset>(100, 42), Opts(10));
  FeedMap batch;
  ASSERT_TRUE(loader.Next(&batch));
  EXPECT_EQ(batch.at("x").dims(), (DDim{10, 32}));
  EXPECT_EQ(batch.at("y").dims(), (DDim{10, 1}));
  EXPECT_EQ(Values<float>(batch.at("x")),
            std::vector<float>(x.data<float>(), x.data<float>() + 320));
}

// ---------------------------------------------------------------- DataLoader

// Example i: "x" float32 [2] = {i, 10 i}, "label" int64 [1] = {i}. Get(fail_at) throws.
class IndexDataset : public Dataset {
 public:
  explicit IndexDataset(int64_t n, int64_t fail_at = -1, int sleep_us = 0, bool std_error = false)
      : n_(n), fail_at_(fail_at), sleep_us_(sleep_us), std_error_(std_error) {}
  int64_t size() const override { return n_; }
  Example Get(int64_t i) const override {
    if (sleep_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(sleep_us_));
    if (i == fail_at_) {
      if (std_error_) throw std::runtime_error("plain failure at " + std::to_string(i));
      KEEL_THROW("corrupt record ", i, " in shard.bin");
    }
    return {Tensor::FromVector<float>({float(i), 10.0f * i}, {2}),
            Tensor::FromVector<int64_t>({i}, {1})};
  }
  std::vector<std::string> names() const override { return {"x", "label"}; }

 private:
  int64_t n_, fail_at_;
  int sleep_us_;
  bool std_error_;
};

// An epoch's batches as lists of example indices, checking that "x" agrees with "label".
std::vector<std::vector<int64_t>> Drain(DataLoader& loader, int64_t epoch) {
  loader.StartEpoch(epoch);
  std::vector<std::vector<int64_t>> batches;
  FeedMap batch;
  while (loader.Next(&batch)) {
    EXPECT_EQ(batch.size(), 2u);
    const Tensor& x = batch.at("x");
    const Tensor& label = batch.at("label");
    const int64_t b = label.dims()[0];
    EXPECT_EQ(label.dims(), (DDim{b, 1}));
    EXPECT_EQ(x.dims(), (DDim{b, 2}));
    std::vector<int64_t> ids = Values<int64_t>(label);
    for (int64_t j = 0; j < b; ++j) {
      EXPECT_EQ(x.data<float>()[2 * j], float(ids[j]));
      EXPECT_EQ(x.data<float>()[2 * j + 1], 10.0f * ids[j]);
    }
    batches.push_back(ids);
  }
  return batches;
}

std::vector<int64_t> Flatten(const std::vector<std::vector<int64_t>>& batches) {
  std::vector<int64_t> all;
  for (auto& b : batches) all.insert(all.end(), b.begin(), b.end());
  return all;
}

std::vector<int64_t> Iota(int64_t n) {
  std::vector<int64_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

TEST(DataLoader, StacksExamplesIntoBatchesKeepingALastShortBatch) {
  DataLoader loader(std::make_shared<IndexDataset>(10), Opts(4));
  EXPECT_EQ(loader.batches_per_epoch(), 3);
  EXPECT_EQ(loader.names(), (std::vector<std::string>{"x", "label"}));
  auto batches = Drain(loader, 0);
  EXPECT_EQ(batches, (std::vector<std::vector<int64_t>>{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9}}));
}

TEST(DataLoader, DropLastDropsTheShortBatch) {
  DataLoader loader(std::make_shared<IndexDataset>(10), Opts(4).DropLast(true));
  EXPECT_EQ(loader.batches_per_epoch(), 2);
  EXPECT_EQ(Drain(loader, 0), (std::vector<std::vector<int64_t>>{{0, 1, 2, 3}, {4, 5, 6, 7}}));
}

TEST(DataLoader, NextIsFalseAtEpochEndUntilStartEpoch) {
  DataLoader loader(std::make_shared<IndexDataset>(5), Opts(2));
  FeedMap batch;
  int n = 0;
  while (loader.Next(&batch)) ++n;  // no StartEpoch: epoch 0
  EXPECT_EQ(n, 3);
  EXPECT_FALSE(loader.Next(&batch));
  EXPECT_FALSE(loader.Next(&batch));
  loader.StartEpoch(1);
  EXPECT_TRUE(loader.Next(&batch));
}

TEST(DataLoader, EmptyDatasetHasNoBatches) {
  DataLoader loader(std::make_shared<IndexDataset>(0), Opts(2).Workers(2));
  EXPECT_EQ(loader.batches_per_epoch(), 0);
  EXPECT_TRUE(Drain(loader, 0).empty());
}

TEST(DataLoader, ShuffleIsReproduciblePerSeedAndEpochAndDiffersAcrossEpochs) {
  auto ds = std::make_shared<IndexDataset>(50);
  LoaderOptions o = Opts(7).Shuffle(11);
  DataLoader a(ds, o), b(ds, o);
  std::set<std::vector<int64_t>> orders;
  for (int64_t epoch = 0; epoch < 4; ++epoch) {
    std::vector<int64_t> order = Flatten(Drain(a, epoch));
    std::vector<int64_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, Iota(50)) << "epoch " << epoch << " is not a permutation";
    EXPECT_NE(order, Iota(50));
    orders.insert(order);
  }
  EXPECT_EQ(orders.size(), 4u) << "epochs repeat an order";
  // A fresh loader starting at epoch 2 sees epoch 2's order; another seed another order.
  EXPECT_EQ(Flatten(Drain(b, 2)), Flatten(Drain(a, 2)));
  EXPECT_EQ(Flatten(Drain(b, 2)), a.EpochIndices(2));
  o.seed = 12;
  DataLoader c(ds, o);
  EXPECT_NE(Flatten(Drain(c, 2)), Flatten(Drain(a, 2)));
}

TEST(DataLoader, ShardsAreDisjointAndEqualLengthOnEveryRank) {
  for (int64_t n : {0, 1, 3, 5, 10, 11, 12, 13, 97}) {
    for (int nranks = 1; nranks <= 4; ++nranks) {
      for (bool drop_last : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << "n " << n << " nranks " << nranks << " drop_last " << drop_last);
        auto ds = std::make_shared<IndexDataset>(n);
        for (int64_t epoch : {0, 1}) {
          std::vector<std::vector<std::vector<int64_t>>> shards;
          for (int rank = 0; rank < nranks; ++rank) {
            DataLoader loader(ds, Opts(3).Shuffle(5).DropLast(drop_last).Rank(rank, nranks));
            shards.push_back(Drain(loader, epoch));
            EXPECT_EQ(static_cast<int64_t>(shards.back().size()), loader.batches_per_epoch());
          }
          std::multiset<int64_t> seen;
          for (int rank = 0; rank < nranks; ++rank) {
            // Same batch count and sizes everywhere, so collectives line up step for step.
            ASSERT_EQ(shards[rank].size(), shards[0].size()) << "rank " << rank;
            for (size_t b = 0; b < shards[rank].size(); ++b)
              EXPECT_EQ(shards[rank][b].size(), shards[0][b].size());
            for (int64_t i : Flatten(shards[rank])) seen.insert(i);
          }
          const int64_t per_rank = drop_last ? n / nranks : (n + nranks - 1) / nranks;
          std::set<int64_t> distinct(seen.begin(), seen.end());
          if (drop_last) {
            // Full batches only: the rank's last per_rank mod 3 samples are dropped too.
            EXPECT_EQ(static_cast<int64_t>(seen.size()), per_rank / 3 * 3 * nranks);
            EXPECT_EQ(distinct.size(), seen.size()) << "a sample on two ranks";
            for (auto& batch : shards[0]) EXPECT_EQ(batch.size(), 3u);
          } else {
            EXPECT_EQ(static_cast<int64_t>(seen.size()), per_rank * nranks);
            const std::vector<int64_t> all = Iota(n);
            EXPECT_EQ(distinct, std::set<int64_t>(all.begin(), all.end()))
                << "a sample missing from the epoch";
            // Only the wrap-around padding repeats.
            EXPECT_EQ(seen.size() - distinct.size(), static_cast<size_t>(per_rank * nranks - n));
          }
        }
      }
    }
  }
}

TEST(DataLoader, OrderIsTheSameForAnyNumberOfWorkers) {
  auto ds = std::make_shared<IndexDataset>(103);
  std::vector<std::vector<std::vector<int64_t>>> reference;
  for (int epoch = 0; epoch < 3; ++epoch) {
    DataLoader sync(ds, Opts(8).Shuffle(9).Workers(0));
    reference.push_back(Drain(sync, epoch));
  }
  for (int workers : {1, 3}) {
    for (int capacity : {1, 2, 16}) {
      SCOPED_TRACE(::testing::Message() << workers << " workers, capacity " << capacity);
      DataLoader loader(ds, Opts(8).Shuffle(9).Workers(workers, capacity));
      for (int epoch = 0; epoch < 3; ++epoch) EXPECT_EQ(Drain(loader, epoch), reference[epoch]);
    }
  }
}

TEST(DataLoader, StartEpochMidEpochRestartsCleanly) {
  auto ds = std::make_shared<IndexDataset>(40, -1, /*sleep_us=*/200);
  for (int workers : {0, 2}) {
    DataLoader loader(ds, Opts(4).Shuffle(1).Workers(workers));
    FeedMap batch;
    loader.StartEpoch(0);
    ASSERT_TRUE(loader.Next(&batch));
    ASSERT_TRUE(loader.Next(&batch));
    EXPECT_EQ(Flatten(Drain(loader, 1)), loader.EpochIndices(1)) << workers << " workers";
  }
}

TEST(DataLoader, DatasetErrorsComeOutOfNextInOrder) {
  for (bool std_error : {false, true}) {
    for (int workers : {0, 1, 3}) {
      SCOPED_TRACE(::testing::Message() << workers << " workers, std_error " << std_error);
      DataLoader loader(std::make_shared<IndexDataset>(40, /*fail_at=*/13, 0, std_error),
                        Opts(4).Workers(workers));
      FeedMap batch;
      loader.StartEpoch(0);
      for (int b = 0; b < 3; ++b) ASSERT_TRUE(loader.Next(&batch)) << b;
      const std::string want = std_error ? "plain failure at 13" : "corrupt record 13 in shard.bin";
      EXPECT_ERROR_WITH(loader.Next(&batch), want, "batch 3", "epoch 0");
      EXPECT_ERROR_WITH(loader.Next(&batch), want);  // the epoch stays failed
      loader.StartEpoch(1);                          // until a new one starts
      EXPECT_TRUE(loader.Next(&batch));
    }
  }
}

TEST(DataLoader, ExamplesOfDifferentShapesAreAnError) {
  class Ragged : public IndexDataset {
   public:
    Ragged() : IndexDataset(8) {}
    Example Get(int64_t i) const override {
      Example ex = IndexDataset::Get(i);
      if (i == 5) ex[0] = Tensor::FromVector<float>({1, 2, 3}, {3});
      return ex;
    }
  };
  DataLoader loader(std::make_shared<Ragged>(), Opts(4).Workers(2));
  FeedMap batch;
  ASSERT_TRUE(loader.Next(&batch));
  EXPECT_ERROR_WITH(loader.Next(&batch), "example 5 field 'x'", "[3]", "[2]");
}

TEST(DataLoader, DestructorMidEpochDoesNotHang) {
  auto slow = std::make_shared<IndexDataset>(10000, -1, /*sleep_us=*/2000);
  const auto start = Clock::now();
  {
    DataLoader idle(slow, Opts(4).Workers(3));  // never started
  }
  {
    DataLoader started(slow, Opts(4).Workers(3, 8));
    started.StartEpoch(0);  // workers busy at once
  }
  {
    DataLoader partway(slow, Opts(4).Workers(3, 8));
    FeedMap batch;
    ASSERT_TRUE(partway.Next(&batch));
    ASSERT_TRUE(partway.Next(&batch));
  }
  {
    DataLoader failed(std::make_shared<IndexDataset>(100, 0), Opts(4).Workers(2));
    FeedMap batch;
    EXPECT_ERROR_WITH(failed.Next(&batch), "corrupt record 0");
  }
  // Each destructor waits at most for the examples in assembly (a few ms each).
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
}

TEST(DataLoader, WorkersAssembleBatchesAheadOfTheConsumer) {
  // Counts Get calls, so the test sees prefetching structurally instead of timing it.
  class Counting : public IndexDataset {
   public:
    Counting() : IndexDataset(100) {}
    Example Get(int64_t i) const override {
      ++gets;
      return IndexDataset::Get(i);
    }
    mutable std::atomic<int> gets{0};
  };
  auto ds = std::make_shared<Counting>();
  DataLoader loader(ds, Opts(5).Workers(2, 4));
  loader.StartEpoch(0);
  FeedMap batch;
  ASSERT_TRUE(loader.Next(&batch));
  // Without asking again, the workers fill the queue: batch 0 plus up to 4 more, 5 examples each.
  for (int i = 0; i < 500 && ds->gets.load() < 25; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(ds->gets.load(), 25);  // never more than the queue capacity ahead
  int n = 0;
  while (loader.Next(&batch)) ++n;
  EXPECT_EQ(n, 19);
}

TEST(DataLoader, RejectsBadOptions) {
  auto ds = std::make_shared<IndexDataset>(10);
  EXPECT_ERROR_WITH(DataLoader(ds, Opts(0)), "batch_size 0");
  EXPECT_ERROR_WITH(DataLoader(ds, Opts(1).Rank(2, 2)), "rank 2");
  EXPECT_ERROR_WITH(DataLoader(ds, Opts(1).Workers(-1)), "num_workers");
  EXPECT_ERROR_WITH(DataLoader(ds, Opts(1).Workers(0, 0)), "queue_capacity");
  EXPECT_ERROR_WITH(DataLoader(nullptr, {}), "no dataset");
  DataLoader loader(ds, {});
  EXPECT_ERROR_WITH(loader.StartEpoch(-1), "epoch -1");
}

TEST(DataLoader, BatchesRealMnistForTraining) {
  SKIP_WITHOUT_MNIST();
  auto test = std::make_shared<MnistDataset>(MnistDir() + "/t10k-images-idx3-ubyte.gz",
                                             MnistDir() + "/t10k-labels-idx1-ubyte.gz", 8000);
  DataLoader loader(test, Opts(128).Shuffle(1).Workers(2).Rank(1, 2));
  EXPECT_EQ(loader.samples_per_rank(), 1000);
  EXPECT_EQ(loader.batches_per_epoch(), 8);  // 7 x 128 + 104
  loader.StartEpoch(0);
  FeedMap batch;
  int64_t seen = 0;
  while (loader.Next(&batch)) {
    const int64_t b = batch.at("label").dims()[0];
    EXPECT_EQ(batch.at("image").dims(), (DDim{b, 1, 28, 28}));
    EXPECT_EQ(batch.at("label").dims(), (DDim{b, 1}));
    EXPECT_EQ(batch.at("image").dtype(), DType::kFloat32);
    seen += b;
  }
  EXPECT_EQ(seen, 1000);
}

}  // namespace
}  // namespace keel
