#include <catch2/catch.hpp>

#include "daemon/util/status.h"

namespace diloco {
namespace {

TEST_CASE("a status keeps its code through WithContext and DL_RETURN_IF_ERROR", "[unit]") {
  CHECK(Status::Ok().code() == StatusCode::kOk);
  CHECK(Status::Error("x").code() == StatusCode::kError);
  CHECK(Status::Error("x", StatusCode::kOk).code() == StatusCode::kError);  // an error is never ok
  CHECK_FALSE(Status::Error("x", StatusCode::kOk).ok());
  const Status st = Status::AddressInUse("bind tcp://127.0.0.1:5555: Address already in use").WithContext("syncer");
  CHECK_FALSE(st.ok());
  CHECK(st.code() == StatusCode::kAddressInUse);
  CHECK(st.message() == "syncer: bind tcp://127.0.0.1:5555: Address already in use");
  CHECK(Status::NotFound("job x").code() == StatusCode::kNotFound);
  CHECK(Status::Refused("no").code() == StatusCode::kRefused);
  auto pass = [] {
    DL_RETURN_IF_ERROR(Status::Refused("too many jobs"));
    return Status::Ok();
  };
  CHECK(pass().code() == StatusCode::kRefused);
}

}  // namespace
}  // namespace diloco
