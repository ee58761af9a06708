// mmt: build datasets from the files users have (pack), look inside them (info, get,
// export), check them (verify) and measure them (bench).
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mmt_commands.h"
#include "mmtensor/packer.h"
#include "mmtensor/mmtensor.h"

namespace mmt::tool {
namespace {
std::string g_published;  // note_published's text
}  // namespace

void note_published(std::string what) { g_published = std::move(what); }

CLI::Option* add_files_then_option(CLI::App* cmd, const std::string& last_name, std::vector<std::string>& files,
                                   std::string& last, const std::string& help) {
  auto split = [&files, &last](const std::vector<std::string>& words) {
    files.assign(words.begin(), words.end() - 1);
    last = words.back();
  };
  // At least two words, so that `--field x a.mmt out` still leaves a.mmt and out to these, as
  // when FILE and DIR were two positionals (CLI11 stops a repeated option short of the words
  // the positionals need at least).
  return cmd->add_option_function<std::vector<std::string>>("FILE... " + last_name, split, help)
      ->required()
      ->expected(2, -1);
}

}  // namespace mmt::tool

namespace {

// The first word of the command line that is not an option names the subcommand (mmt's own
// options, --help and --version, take no value). CLI11 would take an unknown word for a
// stray argument and say only "A subcommand is required"; this says which word and what the
// choices are. Returns false (after saying so) when the word is not a subcommand.
bool check_subcommand_name(CLI::App& app, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word.starts_with('-')) continue;
    std::vector<CLI::App*> known = app.get_subcommands([](CLI::App*) { return true; });
    std::string names;
    for (CLI::App* sub : known) {
      if (sub->check_name(word)) return true;
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    std::cerr << "mmt: unknown subcommand '" << mmt::tool::printable(word) << "'; the subcommands are "
              << names << " (mmt --help describes them)\n";
    return false;
  }
  return true;  // none given: CLI11 says one is required
}

// CLI11 writes a repeated positional as NAME... in the usage line, and TEXT ... beside it in
// the list. "FILE... DIR" (add_files_then_option) says itself which part repeats.
class Formatter : public CLI::Formatter {
 public:
  std::string make_option_usage(const CLI::Option* opt) const override {
    return names_its_repeats(opt) ? opt->get_name() : CLI::Formatter::make_option_usage(opt);
  }
  std::string make_option_opts(const CLI::Option* opt) const override {
    return names_its_repeats(opt) ? " " + get_label("REQUIRED") : CLI::Formatter::make_option_opts(opt);
  }

 private:
  static bool names_its_repeats(const CLI::Option* opt) {
    return opt->get_positional() && opt->get_name().find("...") != std::string::npos;
  }
};

// Parses the command line and runs the chosen subcommand; returns the exit status.
int run(CLI::App& app, int argc, char** argv) {
  if (!check_subcommand_name(app, argc, argv)) return mmt::tool::kExitUsage;
  auto command = [&] {
    auto chosen = app.get_subcommands();
    return chosen.empty() ? std::string("mmt") : "mmt " + chosen.front()->get_name();
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version end the parse too, with status 0: app.exit prints them.
    if (e.get_exit_code() == 0) return app.exit(e);
    // CLI11 gives each kind of parse error its own code (105 for a bad value, 106 for a
    // missing option...); mmt's contract is one status for every bad command line, as
    // getopt-based tools have it, and one form for every message.
    std::cerr << command() << ": error: " << mmt::tool::printable_message(e.what()) << "\n"
              << command() << ": run '" << command() << " --help' for the usage\n";
    return mmt::tool::kExitUsage;
  } catch (const mmt::tool::ExitStatus& e) {
    return e.code;
  } catch (const mmt::tool::UsageError& e) {
    std::cerr << command() << ": error: " << mmt::tool::printable_message(e.what()) << "\n";
    return mmt::tool::kExitUsage;
  } catch (const mmt::InputSpecError& e) {  // pack's or verify's inputs, mistyped
    std::cerr << command() << ": error: " << mmt::tool::printable_message(e.what()) << "\n";
    return mmt::tool::kExitUsage;
  } catch (const mmt::Error& e) {
    // A message may quote a field name or a value from the file: escaped, as info prints them.
    std::cerr << command() << ": error: " << mmt::tool::printable_message(e.what()) << "\n";
    return mmt::tool::kExitError;
  } catch (const std::exception& e) {
    std::cerr << command() << ": error: " << mmt::tool::printable_message(e.what()) << "\n";
    return mmt::tool::kExitError;
  }
  return 0;
}

// Output that did not reach its file is a failure, as coreutils treat it: `mmt info x >
// /dev/full` must not exit 0. Buffered output is written (and fails) only when flushed, so
// the last of it is flushed here; an earlier failed write left the stream's error flag.
int check_standard_output(int status) {
  errno = 0;
  std::cout.flush();
  const bool failed = std::fflush(stdout) != 0 || std::ferror(stdout) || std::cout.fail();
  if (!failed) return status;
  const int err = errno;
  std::cerr << "mmt: cannot write to standard output" << (err ? ": " : "") << (err ? std::strerror(err) : "");
  if (!mmt::tool::g_published.empty())
    std::cerr << " (" << mmt::tool::printable(mmt::tool::g_published) << ")";
  std::cerr << "\n";
  return status != 0 ? status : mmt::tool::kExitError;
}

}  // namespace

int main(int argc, char** argv) {
  // A write past the file-size limit (ulimit -f, a quota of that kind) then fails with EFBIG,
  // which the writers report and clean up after, instead of killing mmt with SIGXFSZ and
  // leaving its temporary file behind.
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"mmt: build, inspect, check and measure mmtensor datasets"};
  app.name("mmt");
  app.set_version_flag("--version", std::string("mmt ") + mmt::version());
  app.require_subcommand(1);
  app.fallthrough(false);
  app.formatter(std::make_shared<Formatter>());  // before the subcommands, which take the app's
  mmt::tool::add_pack_command(app);
  mmt::tool::add_info_command(app);
  mmt::tool::add_verify_command(app);
  mmt::tool::add_get_command(app);
  mmt::tool::add_export_command(app);
  mmt::tool::add_bench_command(app);
  return check_standard_output(run(app, argc, argv));
}
