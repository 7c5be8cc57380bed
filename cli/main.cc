// The `renaissance` command line tool: argument parsing (CLI11) and the mapping of every failure
// to one line on stderr and an exit code (0 ok, 1 comparison failed, 2 bad input or usage,
// 3 backend or system failure). The subcommands live in cmd_*.cc.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/src/io/file_checks.h"
#include "renaissance/error.h"
#include "renaissance/precision.h"

namespace {

using namespace renaissance;
using namespace renaissance::cli;

// One line, whatever the message holds; other control characters (from a file or layout name)
// are escaped so that they cannot drive the terminal.
std::string one_line(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return io::printable(s);
}

// Every name of the precision table (the values --precision takes).
std::vector<std::string> precision_names() {
  std::vector<std::string> names;
  for (const PrecisionRow& row : kPrecisionRows) names.push_back(row.name);
  return names;
}

int fail(const std::string& message, int code) {
  std::fprintf(stderr, "renaissance: error: %s\n", one_line(message).c_str());
  return code;
}

// The options of the hyperparameter table's rows whose kind is `flags` (a number takes X, a flag
// none), in table order, each with its row's help line. Whether one was typed is RunOptions::given.
void add_hyperparameters(CLI::App* app, RunOptions* run, bool flags) {
  for (const HyperparameterInfo& row : kHyperparameterTable) {
    if ((row.flag_field != nullptr) != flags) continue;
    double* value = &run->hyper[static_cast<size_t>(row.id)];
    if (flags) {
      // A flag that is on by default (Muon's nesterov) is turned off by --no-NAME.
      const std::string names = row.fixed_default != 0.0 ? std::string(row.flag) + ",!--no-" + (row.flag + 2) : row.flag;
      app->add_flag_function(names, [value](std::int64_t count) { *value = count > 0 ? 1.0 : 0.0; }, row.help);
    } else if (row.rule == HyperRule::kChoice) {
      // A choice takes one of its names (the value is its index): the names hyper_value_text
      // gives the indices 0 .. count - 1.
      const HyperparameterInfo* info = &row;  // a row of the static table
      app->add_option_function<std::string>(row.flag, [value, info](const std::string& text) {
        const int count = 1 + static_cast<int>(std::count(info->choices, info->choices + std::strlen(info->choices), '|'));
        for (int index = 0; index < count; ++index) {
          if (hyper_value_text(*info, index) == text) {
            *value = index;
            return;
          }
        }
        throw CLI::ValidationError(std::string(info->flag) + " " + io::printable(text) + ": expected one of " +
                                   info->choices);
      }, row.help)->type_name(row.choices);
    } else {
      app->add_option_function<double>(row.flag, [value](const double& v) { *value = v; }, row.help)->type_name("X");
    }
  }
}

// Decimal digits only, within [lo, hi]; throws CLI::ValidationError (exit 2) naming the option.
uint64_t parse_count(const std::string& flag, const std::string& text, uint64_t lo, uint64_t hi) {
  const std::string range = " (expected a whole number from " + std::to_string(lo) + " to " + std::to_string(hi) + ")";
  if (text.empty() || text.size() > 20 || text.find_first_not_of("0123456789") != std::string::npos) {
    throw CLI::ValidationError(flag + " " + io::printable(text) + ": not a whole number" + range);
  }
  uint64_t v = 0;
  for (char c : text) {
    const uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) throw CLI::ValidationError(flag + " " + text + ": too large" + range);
    v = v * 10 + d;
  }
  if (v < lo || v > hi) throw CLI::ValidationError(flag + " " + text + ": out of range" + range);
  return v;
}

// A count option parsed strictly: decimal digits only (no sign, no wrap, no saturation), within
// [lo, hi]; CLI11's own conversion accepts "-1" for an unsigned and wraps it.
template <typename T>
CLI::Option* add_count(CLI::App* app, const std::string& flag, T* value, uint64_t lo, uint64_t hi,
                       const std::string& help) {
  return app
      ->add_option_function<std::string>(
          flag,
          [flag, value, lo, hi](const std::string& text) {
            *value = static_cast<T>(parse_count(flag, text, lo, hi));
          },
          help)
      ->type_name("N");
}

// Fills the "given" list with every option the user typed (resume compares those only).
void record_given(CLI::App* app, std::vector<std::string>* given) {
  for (const CLI::Option* opt : app->get_options()) {
    if (opt->count() > 0 && !opt->get_lnames().empty()) given->push_back("--" + opt->get_lnames().front());
  }
}

// No option takes "" as its value. CLI11 converts "" to 0 (--lr "" ran with lr 0, --nan-at ""
// poisoned step 0) and a string option cannot tell "" from "not given" (--distributed "" ran on
// one process), so an unset shell variable silently ran something else. Put on every option that
// takes a value, this check runs before the option's own conversion: the parse fails with exit 2
// naming the option ("--lr: the value is empty"), before anything is set, run or written.
void refuse_empty_values(CLI::App* app) {
  const CLI::Validator non_empty(
      [](std::string& value) {
        return value.empty() ? std::string("the value is empty; give one or leave the option out") : std::string();
      },
      "");  // no description: the --help type names stay as they are
  for (CLI::Option* opt : app->get_options()) {
    // Flags take no value; a positional argument has its own message (replay's case folder).
    // transform() puts it first, before the option's own checks (IsMember would say "not in").
    if (opt->get_type_size() != 0 && !opt->get_positional()) opt->transform(non_empty);
  }
  for (CLI::App* sub : app->get_subcommands([](CLI::App*) { return true; })) refuse_empty_values(sub);
}

// What the check above cannot see, since CLI11 handles it before any check runs: "--name=" (the
// empty value in the other spelling) makes CLI11 take the NEXT argument as the value (--model=
// --steps 1 read the layout "--steps"; a flag's "--json=" read as on), and an empty item of a
// list (--nan-at 1,,2 or 1,) is dropped. Scans the arguments of the subcommand given (up to a
// "--"), with the same CLI11 error (exit 2, naming the option) as the check.
void refuse_empty_inline_values(CLI::App* app, int argc, char** argv) {
  CLI::App* sub = nullptr;
  int i = 1;
  for (; i < argc && sub == nullptr; ++i) {
    for (CLI::App* s : app->get_subcommands([](CLI::App*) { return true; })) {
      if (s->get_name() == argv[i]) sub = s;
    }
  }
  if (sub == nullptr) return;  // CLI11 says what is missing
  for (; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") return;  // what follows is positional
    if (arg.rfind("--", 0) != 0) continue;
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    CLI::Option* opt = nullptr;
    for (CLI::Option* o : sub->get_options()) {
      if (o->check_lname(name)) opt = o;
    }
    if (opt == nullptr) continue;  // CLI11 names an unknown option
    const std::string flag = "--" + name;
    if (eq != std::string::npos && eq + 1 == arg.size()) {
      throw CLI::ValidationError(flag, "the value is empty; give one or leave the option out");
    }
    if (opt->get_delimiter() == '\0') continue;
    // The values of a list option: the one after "=", or the arguments that follow it.
    std::vector<std::string> values;
    if (eq != std::string::npos) values.push_back(arg.substr(eq + 1));
    for (int j = i + 1; eq == std::string::npos && j < argc && argv[j][0] != '-'; ++j) values.push_back(argv[j]);
    const std::string delim(1, opt->get_delimiter());
    for (const std::string& v : values) {
      if (v.empty()) continue;  // the check on every option refuses it
      if (v.rfind(delim, 0) == 0 || v.back() == delim[0] || v.find(delim + delim) != std::string::npos) {
        throw CLI::ValidationError(flag, "an empty item in \"" + io::printable(v) + "\"; give every item or leave it out");
      }
    }
  }
}

// `renaissance run` and its options, in --help order.
CLI::App* add_run_command(CLI::App* app, RunOptions* run) {
  CLI::App* run_cmd = app->add_subcommand(
      "run", "Run an optimizer over a model layout on synthetic gradients; report speed and a fingerprint");
  run_cmd->add_option("--model", run->model, "Built-in layout name (see `renaissance layouts`) or a layout JSON file")
      ->capture_default_str()->type_name("NAME|FILE");
  run_cmd->add_option("--optimizer", run->optimizer,
                      "Optimizer kind: " + optimizer_kind_names(", ") + " (see `renaissance kinds`)")
      ->capture_default_str()->type_name("KIND");
  add_hyperparameters(run_cmd, run, /*flags=*/false);
  run_cmd->add_option("--weight-decay-mode", run->weight_decay_mode, "SGD kinds: decoupled (default) or l2")
      ->type_name("MODE");
  add_hyperparameters(run_cmd, run, /*flags=*/true);
  add_count(run_cmd, "--steps", &run->steps, 1, kMaxSteps, "Optimizer steps to run (default 20; after --resume: the total)");
  add_count(run_cmd, "--schedule-steps", &run->schedule_steps, 1, kMaxSteps,
            "Horizon of the lr schedule (default: --steps of a fresh run; stored in the checkpoint)");
  run_cmd->add_option("--backend", run->backend, "cpu, cuda or auto (CUDA when a device is present)")
      ->capture_default_str()->type_name("NAME");
  add_count(run_cmd, "--threads", &run->threads, 0, kMaxThreadsOption, "CPU threads (0: all cores; at most 1024)");
  run_cmd->add_option("--schedule", run->schedule, "Learning-rate schedule: constant, cosine or step (x0.1 per third)")
      ->capture_default_str()->type_name("NAME");
  add_count(run_cmd, "--warmup", &run->warmup, 0, kMaxSteps, "Linear warm-up steps before the schedule (default 0)");
  run_cmd->add_option("--loss-scale", run->loss_scale, "AMP loss scale the synthetic gradients carry")
      ->capture_default_str()->type_name("S");
  run_cmd->add_option("--nan-at", run->nan_at, "Steps (0-based, comma-separated) whose gradients get a NaN")
      ->delimiter(',')->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)->type_name("T1,T2,...");
  add_count(run_cmd, "--seed", &run->seed, 0, UINT64_MAX, "Seed of the synthetic weights and gradients (0 .. 2^64-1)");
  run_cmd->add_option("--checkpoint", run->checkpoint, "Save the state to this file at the end (atomically: temp file, fsync, rename)");
  add_count(run_cmd, "--checkpoint-every", &run->checkpoint_every, 0, kMaxSteps, "Also save every K steps (needs --checkpoint)");
  run_cmd->add_option("--resume", run->resume,
                      "Load this checkpoint and continue from its step; its configuration is inherited");
  run_cmd->add_option("--override", run->overrides,
                      "On --resume: allow this option (lr, seed, schedule, ...) to differ from the checkpoint")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)->type_name("NAME");
  run_cmd->add_flag("--no-check-finite", run->no_check_finite, "Do not skip steps with NaN/Inf gradients (saves one read of G)");
  run_cmd->add_option("--precision", run->precision,
                      "fp32, or keep a " + precision_names_text(true) + " model copy besides the fp32 masters")
      ->check(CLI::IsMember(precision_names()));
  run_cmd->add_flag("--stochastic-rounding", run->stochastic_rounding,
                    "Round the model copy stochastically (Philox keyed by --seed, step, tensor, element)");
  run_cmd->add_option("--grad-dtype", run->grad_dtype,
                      "With --precision " + precision_names_text(true) + ": model holds the gradients in the model "
                      "dtype (its encoding's bytes per param, widened exactly); fp32 (default) keeps fp32 gradients")
      ->check(CLI::IsMember({"fp32", "model"}));
  run_cmd->add_flag("--json", run->json, "Print the result as one JSON object on stdout");
  run_cmd->add_option("--distributed", run->distributed,
                      "mpi (CPU ranks) or nccl (CUDA ranks, one GPU each): a sharded step over the ranks of mpirun "
                      "(docs/distributed.md)")
      ->type_name("ENGINE");
  run_cmd->add_option("--grad-reduce", run->grad_reduce,
                      "With --distributed: replicated, ordered (default; rank-order sum / K) or fast (reduce-scatter)")
      ->type_name("MODE");
  add_count(run_cmd, "--simulate-ranks", &run->simulate_ranks, 1, 1024,
            "One process: G is the rank-order sum / K of K ranks' synthetic gradients (audits --grad-reduce ordered)");
  return run_cmd;
}

// `renaissance replay` and its options, in --help order.
CLI::App* add_replay_command(CLI::App* app, ReplayOptions* replay) {
  CLI::App* replay_cmd = app->add_subcommand(
      "replay", "Re-run a recorded case (docs/replay-format.md) and compare with its float64 reference");
  replay_cmd->add_option("case_dir", replay->case_dir, "Case folder: case.json, init/grads[/expected].safetensors")
      ->required()->type_name("CASE_DIR");
  replay_cmd->add_option("--backend", replay->backend, "cpu, cuda or auto")->capture_default_str()->type_name("NAME");
  add_count(replay_cmd, "--threads", &replay->threads, 0, kMaxThreadsOption, "CPU threads (0: all cores; at most 1024)");
  replay_cmd->add_option("--out", replay->out, "Write final weights, m/NAME and v/NAME here (F32 safetensors, atomically)")
      ->type_name("FILE");
  replay_cmd
      ->add_option("--tolerance", replay->tolerance,
                   "Largest relative L2 error per tensor that passes (default: case.json's tolerance, else 1e-6)")
      ->each([replay](const std::string&) { replay->tolerance_given = true; })
      ->type_name("X");
  return replay_cmd;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "renaissance: fused deep-learning optimizers with bit-identical CPU and CUDA backends.\n"
      "Runs an optimizer over a model layout, replays recorded cases against a float64 reference,\n"
      "and audits that every backend produces the same bits.",
      "renaissance"};
  app.require_subcommand(1);
  // Like most Unix tools, a repeated option takes its last value (scripts append overrides).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.footer(
      "Examples:\n"
      "  renaissance run                                   resnet50, AdamW, best backend\n"
      "  renaissance run --model bert_base --optimizer lars --steps 50 --json\n"
      "  renaissance replay testdata/replay/adamw --out result.safetensors\n"
      "  renaissance audit\n"
      "Exit codes: 0 ok; 1 a comparison or audit failed; 2 bad command, option or input file (fix the\n"
      "command); 3 a system failure during the work (disk full, I/O error, backend). See README.md.");

  RunOptions run;
  CLI::App* run_cmd = add_run_command(&app, &run);
  ReplayOptions replay;
  CLI::App* replay_cmd = add_replay_command(&app, &replay);

  // ---- audit ----
  AuditOptions audit;
  CLI::App* audit_cmd = app.add_subcommand(
      "audit", "Run every optimizer kind, then the conformance suite's bf16/fp16 mixed-precision cells, on every "
               "available backend; print fingerprints, whether they agree and whether they match the golden file");
  add_count(audit_cmd, "--steps", &audit.steps, 1, kMaxSteps,
            "Steps per kind run (default 8; the mixed-precision cells keep their own)");
  audit_cmd->add_flag("--json", audit.json, "Print the table as one JSON object");

  // ---- layouts ----
  bool layouts_json = false;
  CLI::App* layouts_cmd = app.add_subcommand("layouts", "List the built-in model layouts");
  layouts_cmd->add_flag("--json", layouts_json, "Print the list as JSON");

  // ---- kinds ----
  bool kinds_json = false;
  CLI::App* kinds_cmd = app.add_subcommand("kinds", "List the optimizer kinds with their defaults (the kind table)");
  kinds_cmd->add_flag("--json", kinds_json, "Print the kind table as JSON (for scripts)");

  refuse_empty_values(&app);  // after the last option is added: it applies to every option

  try {
    refuse_empty_inline_values(&app, argc, argv);
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    return fail(std::string(e.what()) + " (see renaissance --help)", kExitBadInput);
  }

  try {
    if (run_cmd->parsed()) {
      record_given(run_cmd, &run.given);
      return cmd_run(run);
    }
    if (replay_cmd->parsed()) {
      if (replay.case_dir.empty()) throw_invalid("replay \"\": the case folder is empty");
      return cmd_replay(replay);
    }
    if (audit_cmd->parsed()) return cmd_audit(audit);
    if (layouts_cmd->parsed()) return cmd_layouts(layouts_json);
    if (kinds_cmd->parsed()) return cmd_kinds(kinds_json);
  } catch (const SystemFailure& e) {
    return fail(e.what(), kExitRuntime);
  } catch (const Error& e) {
    return fail(e.what(), e.kind() == ErrorKind::kBackend ? kExitRuntime : kExitBadInput);
  } catch (const std::bad_alloc&) {
    return fail("out of memory", kExitRuntime);
  } catch (const std::exception& e) {
    return fail(e.what(), kExitRuntime);
  }
  return fail("no subcommand (see renaissance --help)", kExitBadInput);
}
