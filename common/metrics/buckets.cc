#include "common/metrics/buckets.h"

namespace tandem::buckets {

const std::vector<double>& FirstTokenSeconds() {
  static const std::vector<double> b = {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06,
                                        0.08,  0.1,    0.25,  0.5,  0.75, 1,    2.5,
                                        5,     7.5,    10,    20,   40,   80};
  return b;
}

const std::vector<double>& InterTokenSeconds() {
  static const std::vector<double> b = {0.0005, 0.001, 0.0025, 0.005, 0.01,  0.015, 0.02,
                                        0.025,  0.03,  0.04,   0.05,  0.075, 0.1,   0.15,
                                        0.2,    0.3,   0.4,    0.5,   0.75,  1,     2.5};
  return b;
}

const std::vector<double>& RequestSeconds() {
  static const std::vector<double> b = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,   2.5, 5,  10,
                                        15,   20,    30,   40,  50,   60,  120, 240, 480};
  return b;
}

const std::vector<double>& TransferSeconds() {
  static const std::vector<double> b = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                        0.1,    0.25,  0.5,    1,     2.5,  5,     10};
  return b;
}

const std::vector<double>& TransferBytes() {
  static const std::vector<double> b = [] {
    std::vector<double> v;
    for (double x = 4096; x <= 4.0 * 1024 * 1024 * 1024; x *= 4) v.push_back(x);
    return v;
  }();
  return b;
}

const std::vector<double>& RequestTokens() {
  static const std::vector<double> b = [] {
    std::vector<double> v;
    for (double x = 1; x <= 32768; x *= 2) v.push_back(x);
    return v;
  }();
  return b;
}

const std::vector<double>& AcceptedTokens() {
  static const std::vector<double> b = [] {
    std::vector<double> v;
    for (int x = 0; x <= 16; ++x) v.push_back(x);
    return v;
  }();
  return b;
}

}  // namespace tandem::buckets
