#include "python_free_cli/help.h"

#include <gflags/gflags.h>

#include <cstdio>
#include <set>
#include <sstream>
#include <vector>

namespace keel {
namespace cli {

namespace {

struct Group {
  const char* title;
  std::vector<const char*> flags;  // "name" or "name=shown default"
};

struct Command {
  const char* name;
  const char* usage;
  std::vector<Group> groups;
  // Sources whose other flags go under "other": a path, or a prefix ending in '*'
  // ("python_free_cli/train*" is every file of keel train, present and future).
  std::vector<const char*> own_files;
};

const std::vector<Command>& Commands() {
  static const std::vector<Command> commands = {
      {"train",
       "usage: keel train --model=mlp|lenet|resnet|transformer|ctr [flags]\n"
       "Trains a built-in model and prints its loss; under `keel launch`, data-parallel.\n",
       {{"model and data",
         {"model", "data", "mlp_hidden", "batch_size", "steps", "epochs", "seed"}},
        {"transformer and ctr",
         {"vocab", "seq_len", "d_model", "heads", "d_ff", "layers", "dropout", "ctr_table"}},
        {"optimizer",
         {"optimizer", "lr", "momentum", "nesterov", "beta1", "beta2", "epsilon", "weight_decay",
          "clip_global_norm", "gradient_merge_k", "amp", "amp_level", "recompute"}},
        {"learning-rate schedule",
         {"lr_schedule", "lr_boundaries", "lr_values", "lr_decay_steps", "min_lr", "warmup_steps",
          "warmup_start_lr"}},
        {"watching",
         {"fetch_frequency", "eval_every", "progress", "logdir", "logdir_all_ranks",
          "log_all_ranks", "profile"}},
        {"checkpoints",
         {"save_dir", "save_every", "auto_resume", "save_inference_dir", "load_dir"}},
        {"several workers (see keel launch --help)",
         {"nccl_comm_num", "fuse_all_reduce_ops", "fuse_parameter_memory_size",
          "fuse_parameter_groups_size", "hierarchical_allreduce_inter_nranks", "local_sgd_steps",
          "local_sgd_warmup_steps", "sharding_stage", "tp_degree", "pp_degree", "micro_batches",
          "pp_schedule", "cpu_comm_backend", "gpu_comm_backend", "comm_timeout_s",
          "sync_batch_norm", "fp16_allreduce", "ps_mode", "geo_k"}},
        {"performance",
         {"num_iteration_per_drop_scope", "num_threads", "cpu_math_threads", "conv_onednn",
          "cuda_graph"}}},
       {"python_free_cli/train*"}},
      {"inspect",
       "usage: keel inspect FILE|DIR                  a __model__, .safetensors or checkpoint dir\n"
       "       keel inspect --strategy [--model=NAME | FILE] --nranks=N [--nnodes=K] [flags]\n"
       "       keel inspect --summary [--model=NAME | FILE|DIR]\n"
       "--strategy takes keel train's strategy and optimizer flags (keel train --help).\n",
       {{"what to show", {"strategy", "summary", "model", "dot", "diff", "program"}},
        {"the job (--strategy)", {"nranks", "nnodes", "rank", "startup"}},
        {"a parameter-server job (--strategy --ps)",
         {"ps", "nservers", "nworkers", "ps_mode", "geo_k"}}},
       {"python_free_cli/inspect.cc"}},
      {"bench",
       "usage: keel bench mlp|lenet|resnet|transformer|ctr|allreduce [flags]\n"
       "Times training steps (or all-reduces under keel launch); prints one JSON line.\n",
       {{"bench",
         {"bench_steps", "bench_warmup", "bench_numel", "batch_size", "seed", "profile",
          "cuda_graph", "sync_batch_norm", "fp16_allreduce", "ps_mode", "geo_k", "ps_max_staleness",
          "ctr_table"}}},
       {"python_free_cli/bench.cc"}},
      {"launch",
       "usage: keel launch [flags] COMMAND [ARGS...]\n"
       "Starts this node's workers of a job, each with Paddle's and torchrun's environment\n"
       "variables; stops them all when one fails and names it.\n",
       {{"this node",
         {"nproc_per_node", "selected_gpus", "gpu_comm_backend",
          "log_dir=log|Workers' output goes to DIR/workerlog.N.", "grace_period_s", "server_num",
          "worker_num", "cpu_sched", "cpu_bind"}},
        {"several nodes",
         {"nnodes", "node_rank", "cluster_node_ips", "node_ip", "started_port", "master_addr",
          "master_port"}}},
       {"python_free_cli/launch.cc"}},
  };
  return commands;
}

// The description wrapped at `width` columns from column `col` (the first line after `line`).
std::vector<std::string> Wrap(std::string line, const std::string& text, size_t col, size_t width) {
  std::vector<std::string> lines;
  std::istringstream words(text);
  std::string word;
  bool first = true;
  while (words >> word) {
    if (!first && line.size() + 1 + word.size() > width) {
      lines.push_back(line);
      line = std::string(col, ' ');
      first = true;
    }
    line += (first ? "" : " ") + word;
    first = false;
  }
  lines.push_back(line);
  return lines;
}

// "  --name=default" then the description, wrapped at 100 columns; a description longer than
// two lines is cut to its first sentence (--helpfull has it whole).
void Entry(std::ostringstream& out, const std::string& spec) {
  // spec: name, or name=shown default|description (for flags keel borrows, like glog's).
  std::string name = spec.substr(0, spec.find('='));
  gflags::CommandLineFlagInfo info;
  if (!gflags::GetCommandLineFlagInfo(name.c_str(), &info)) return;
  std::string shown = info.default_value;
  if (spec.find('=') != std::string::npos) {
    std::string rest = spec.substr(spec.find('=') + 1);
    shown = rest.substr(0, rest.find('|'));
    if (rest.find('|') != std::string::npos) info.description = rest.substr(rest.find('|') + 1);
  }
  if (info.type == "string" && shown.empty()) shown = "\"\"";
  if (info.type == "double") {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%g", std::stod(shown));
    shown = buf;
  }
  std::string head = "  --" + name + "=" + shown;
  const size_t col = 34, width = 100;
  std::string first = head.size() < col ? head + std::string(col - head.size(), ' ') : head + " ";
  std::vector<std::string> lines = Wrap(first, info.description, col, width);
  size_t end = info.description.find(". ");
  while (end != std::string::npos && end >= 3 && info.description.compare(end - 3, 3, "e.g") == 0)
    end = info.description.find(". ", end + 2);
  if (lines.size() > 2 && end != std::string::npos)
    lines = Wrap(first, info.description.substr(0, end + 1), col, width);
  for (const std::string& l : lines) out << l << "\n";
}

}  // namespace

std::string CommandHelp(const std::string& command) {
  for (const Command& c : Commands()) {
    if (command != c.name) continue;
    std::ostringstream out;
    out << c.usage;
    std::set<std::string> listed;
    for (const Group& g : c.groups) {
      out << "\n" << g.title << ":\n";
      for (const char* spec : g.flags) {
        Entry(out, spec);
        std::string s = spec;
        listed.insert(s.substr(0, s.find('=')));
      }
    }
    std::vector<gflags::CommandLineFlagInfo> all;
    gflags::GetAllFlags(&all);
    bool header = false;
    for (const auto& info : all) {
      bool own = false;
      for (std::string f : c.own_files) {
        const std::string& file = info.filename;
        if (!f.empty() && f.back() == '*') {  // a prefix of the path below the source root
          f.pop_back();
          const size_t at = file.rfind(f);
          own = own || (at != std::string::npos && (at == 0 || file[at - 1] == '/') &&
                        file.find('/', at + f.size()) == std::string::npos);
        } else {
          own = own ||
                (file.size() >= f.size() && file.compare(file.size() - f.size(), f.size(), f) == 0);
        }
      }
      if (!own || listed.count(info.name)) continue;
      if (!header) out << "\nother:\n";
      header = true;
      Entry(out, info.name);
    }
    out << "\nAny flag can also be set as FLAGS_name=value in the environment; "
           "`keel "
        << c.name << " --helpfull` lists every flag.\n";
    return out.str();
  }
  return "";
}

}  // namespace cli
}  // namespace keel
