// mmt: build datasets from the files users have (pack), look inside them (info, get,
// export), check them (verify) and measure them (bench).
#include <iostream>

#include "mmt_commands.h"
#include "mmtensor/mmtensor.h"

int main(int argc, char** argv) {
  CLI::App app{"mmt: build, inspect, check and measure mmtensor datasets"};
  app.name("mmt");
  app.set_version_flag("--version", std::string("mmt ") + mmt::version());
  app.require_subcommand(1);
  app.fallthrough(false);
  mmt::tool::add_pack_command(app);
  mmt::tool::add_info_command(app);
  mmt::tool::add_verify_command(app);
  mmt::tool::add_get_command(app);
  mmt::tool::add_export_command(app);
  mmt::tool::add_bench_command(app);

  auto command = [&] {
    auto chosen = app.get_subcommands();
    return chosen.empty() ? std::string("mmt") : "mmt " + chosen.front()->get_name();
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);  // --help prints and exits 0; a bad command line exits 2 with the reason
  } catch (const mmt::tool::ExitStatus& e) {
    return e.code;
  } catch (const mmt::Error& e) {
    std::cerr << command() << ": error: " << e.what() << "\n";
    return mmt::tool::kExitError;
  } catch (const std::exception& e) {
    std::cerr << command() << ": error: " << e.what() << "\n";
    return mmt::tool::kExitError;
  }
  return 0;
}
