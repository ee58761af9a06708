// mmt get FILE INDEX [--field NAME] [--npy OUT.npy | --raw OUT]: one record, printed as
// PyTorch prints tensors, or one field written to a file.
#include <fstream>
#include <iostream>
#include <memory>

#include "mmt_commands.h"
#include "mmtensor/dataset.h"
#include "mmtensor/numpy_io.h"

namespace mmt::tool {
namespace {

struct GetArgs {
  std::string file;
  int64_t index = 0;
  std::string field;
  std::string npy;
  std::string raw;
};

void write_raw(const std::string& path, const Tensor& t) {
  Tensor c = t.contiguous();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (c.nbytes() > 0)
    out.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
  out.close();
  if (!out) throw IoError("cannot write " + path);
}

void run_get(const GetArgs& args) {
  Dataset ds = Dataset::open(args.file);
  if (!args.npy.empty() || !args.raw.empty()) {
    std::string field = args.field;
    if (field.empty()) {
      MMT_CHECK(ds.schema().size() == 1, ValueError, "--npy and --raw write one field: name it with ",
                "--field (", ds.schema().size(), " fields here)");
      field = ds.schema()[0].name;
    }
    Tensor value = ds.get(args.index, field);
    if (!args.npy.empty()) save_npy(args.npy, value);
    if (!args.raw.empty()) write_raw(args.raw, value);
    return;
  }
  if (!args.field.empty()) {
    std::cout << ds.get(args.index, args.field).to_string() << "\n";
    return;
  }
  Sample sample = ds.get(args.index);
  // A dict of tensors, as printing a PyTorch sample dict shows it.
  std::cout << "{";
  for (size_t i = 0; i < sample.size(); ++i) {
    std::cout << (i ? ",\n " : "") << "'" << ds.schema()[i].name << "': " << sample[i].to_string();
  }
  std::cout << "}\n";
}

}  // namespace

void add_get_command(CLI::App& app) {
  auto args = std::make_shared<GetArgs>();
  CLI::App* cmd = app.add_subcommand("get", "Print one record (PyTorch's style) or write a field to .npy");
  cmd->add_option("FILE", args->file, "The dataset file")->required();
  cmd->add_option("INDEX", args->index, "Record index (negative counts from the end)")->required();
  cmd->add_option("--field", args->field, "Only this field");
  cmd->add_option("--npy", args->npy, "Write the field to this .npy file instead of printing");
  cmd->add_option("--raw", args->raw, "Write the field's bytes as they are (an encoded image, say)");
  cmd->callback([args] { run_get(*args); });
}

}  // namespace mmt::tool
