// DeepSpeed's csv_monitor: one CSV file per tag in the monitor's folder, named after the tag with '/'
// and ' ' replaced by '_' ("Train/Samples/lr" -> Train_Samples_lr.csv), its header row "step,<the
// tag's last '/' component>" and one row "<samples>,<value>" per scalar; rows end in "\r\n" and values
// are written as Python's str(float) writes them, as DeepSpeed's csv.writer does.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <string_view>

#include "base/file_util.hpp"
#include "trainer/monitor/sink.hpp"

namespace shardkit::trainer::monitor {

// The file of `tag`: "Train/Samples/lr" -> "Train_Samples_lr.csv".
std::string csv_file_name(std::string_view tag);
// The header of its value column: the tag's last '/' component ("lr").
std::string csv_column(std::string_view tag);
// `x` as Python's repr(float) and str(float) write it: the shortest digits that read back as `x`, in
// positional notation for exponents -4 to 15 ("0.0001", "65536.0") and scientific outside it
// ("1e-05", "1.5e+16"); "nan", "inf", "-inf".
std::string python_float(double x);

// The CSV files of one folder (which must exist). A file is opened at its tag's first scalar and kept
// open; a file that is new or empty gets the header row first, so a resumed run appends its rows
// under the header already there.
class CsvSink : public Sink {
 public:
  explicit CsvSink(std::filesystem::path folder);
  void write(std::span<const Scalar> scalars) override;
  std::string describe() const override;

 private:
  std::filesystem::path folder_;
  std::map<std::string, FileDescriptor> files_;  // by tag
};

}  // namespace shardkit::trainer::monitor
