// kevo/net/endpoint.hpp: where an LLM server lives, parsed from a base URL.
//
//   auto ep = kevo::net::parse_endpoint("https://api.openai.com/v1");
//   ep->host == "api.openai.com"; ep->port == "443"; ep->tls == true;
//   ep->request_path(kevo::net::WireFormat::openai) == "/v1/chat/completions";
#pragma once

#include <kevo/expected.hpp>
#include <kevo/net/chat.hpp>

#include <fmt/format.h>

#include <string>
#include <string_view>

namespace kevo::net {

struct Endpoint {
  bool tls = false;
  std::string host;       ///< without brackets for IPv6 literals
  std::string port;
  std::string base_path;  ///< without a trailing slash: "", "/v1", "/proxy/v1"

  /// The API path for `format`. A base URL that already ends in /v1 (as OpenAI's SDKs expect) is
  /// not given a second one.
  std::string request_path(WireFormat format) const {
    const std::string_view tail = format == WireFormat::openai ? "/chat/completions" : "/messages";
    if (base_path.ends_with("/v1")) return base_path + std::string(tail);
    return base_path + "/v1" + std::string(tail);
  }

  /// The Host header: the port is named only when it is not the scheme's default.
  std::string host_header() const {
    const bool default_port = (tls && port == "443") || (!tls && port == "80");
    const std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
    return default_port ? h : h + ":" + port;
  }
};

inline expected<Endpoint, Error> parse_endpoint(std::string_view url) {
  Endpoint ep;
  if (url.starts_with("https://")) {
    ep.tls = true;
    url.remove_prefix(8);
  } else if (url.starts_with("http://")) {
    url.remove_prefix(7);
  } else {
    return make_error(fmt::format("base URL '{}' must start with http:// or https://", url));
  }
  const std::size_t slash = url.find('/');
  std::string_view authority = url.substr(0, slash);
  std::string_view path = slash == std::string_view::npos ? std::string_view() : url.substr(slash);
  if (authority.find('@') != std::string_view::npos)
    return make_error("base URL must not carry credentials; name an API key variable instead");
  std::string_view port;
  if (authority.starts_with("[")) {  // [::1]:8080
    const std::size_t close = authority.find(']');
    if (close == std::string_view::npos) return make_error(fmt::format("base URL has an unclosed IPv6 literal"));
    ep.host = std::string(authority.substr(1, close - 1));
    if (close + 1 < authority.size() && authority[close + 1] == ':') port = authority.substr(close + 2);
  } else {
    const std::size_t colon = authority.rfind(':');
    ep.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) port = authority.substr(colon + 1);
  }
  if (ep.host.empty()) return make_error("base URL has no host");
  ep.port = port.empty() ? (ep.tls ? "443" : "80") : std::string(port);
  for (char c : ep.port)
    if (c < '0' || c > '9') return make_error(fmt::format("base URL port '{}' is not a number", ep.port));
  while (path.ends_with('/')) path.remove_suffix(1);
  if (path.find_first_of("?#") != std::string_view::npos) return make_error("base URL must not have a query or fragment");
  ep.base_path = std::string(path);
  return ep;
}

}  // namespace kevo::net
