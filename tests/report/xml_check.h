// A small well-formedness check for the SVG and HTML we write: tags balance,
// attributes are quoted, and text holds no raw '<' or stray '&'. Not a full XML
// parser, enough to catch a missing close tag or an unescaped label.
#pragma once

#include <cctype>
#include <string>
#include <vector>

namespace diloco::testing {

// Returns "" when well formed, else what is wrong and where. Void HTML elements
// (meta, br) and <!...> declarations are allowed when html is true.
inline std::string XmlProblem(const std::string &text, bool html = false) {
  std::vector<std::string> open;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '&') {
      const size_t semi = text.find(';', i);
      if (semi == std::string::npos || semi - i > 8) return "stray '&' at " + std::to_string(i);
      continue;
    }
    if (c == '>') return "stray '>' at " + std::to_string(i);
    if (c != '<') continue;
    const size_t end = text.find('>', i);
    if (end == std::string::npos) return "unclosed tag at " + std::to_string(i);
    std::string tag = text.substr(i + 1, end - i - 1);
    i = end;
    if (html && !tag.empty() && tag[0] == '!') continue;
    if (tag.empty()) return "empty tag";
    // Quotes must pair inside a tag, and a quoted value holds no '<'.
    size_t quotes = 0;
    for (char q : tag) quotes += q == '"';
    if (quotes % 2 != 0) return "unbalanced quotes in <" + tag + ">";
    const bool closing = tag[0] == '/';
    const bool self_closing = tag.back() == '/';
    size_t name_end = closing ? 1 : 0;
    while (name_end < tag.size() && (std::isalnum(static_cast<unsigned char>(tag[name_end])) || tag[name_end] == '-'))
      ++name_end;
    const std::string name = tag.substr(closing ? 1 : 0, name_end - (closing ? 1 : 0));
    if (name.empty()) return "tag without a name: <" + tag + ">";
    if (closing) {
      if (open.empty() || open.back() != name)
        return "</" + name + "> closes <" + (open.empty() ? std::string("nothing") : open.back()) + ">";
      open.pop_back();
    } else if (!self_closing && !(html && (name == "meta" || name == "br"))) {
      open.push_back(name);
    }
  }
  if (!open.empty()) return "<" + open.back() + "> never closed";
  return "";
}

// Every <svg ...>...</svg> element in text.
inline std::vector<std::string> SvgElements(const std::string &text) {
  std::vector<std::string> out;
  for (size_t pos = text.find("<svg"); pos != std::string::npos; pos = text.find("<svg", pos + 1)) {
    const size_t end = text.find("</svg>", pos);
    if (end == std::string::npos) break;
    out.push_back(text.substr(pos, end + 6 - pos));
  }
  return out;
}

}  // namespace diloco::testing
