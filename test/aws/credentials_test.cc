// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Credentials and region found as the AWS SDKs find them (src/aws/client.h):
// given, then the environment, then the shared credentials and config files
// of the profile. No network. Each test sets the variables it relies on and
// clears the others (gtest_discover_tests runs each test in a process of its
// own).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "aws/client.h"
#include "idem/testing/gtest.h"
#include "idem/testing/throwaway.h"

namespace idem::aws_internal {
namespace {

using idem::testing::TempDir;

class AwsCredentialsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                          "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"})
      ::unsetenv(v);
    ::setenv("HOME", dir_.path().c_str(), 1);  // no ~/.aws of the machine's
  }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_.File(name);
    std::ofstream(path) << text;
    return path;
  }
  TempDir dir_;
};

TEST_F(AwsCredentialsTest, GivenOnesWinOverTheEnvironment) {
  ::setenv("AWS_ACCESS_KEY_ID", "AKIDENV", 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", "env-secret", 1);
  auto c = FindCredentials({.given = {.access_key_id = "AKIDGIVEN", .secret_access_key = "given-secret"}});
  ASSERT_OK(c);
  EXPECT_EQ(c->access_key_id, "AKIDGIVEN");
  EXPECT_EQ(c->secret_access_key, "given-secret");
}

TEST_F(AwsCredentialsTest, TheEnvironmentWinsOverTheFilesAndCarriesTheSessionToken) {
  Write("credentials", "[default]\naws_access_key_id = AKIDFILE\naws_secret_access_key = file-secret\n");
  ::setenv("AWS_SHARED_CREDENTIALS_FILE", dir_.File("credentials").c_str(), 1);
  ::setenv("AWS_ACCESS_KEY_ID", "AKIDENV", 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", "env-secret", 1);
  ::setenv("AWS_SESSION_TOKEN", "env-token", 1);
  auto c = FindCredentials({});
  ASSERT_OK(c);
  EXPECT_EQ(c->access_key_id, "AKIDENV");
  EXPECT_EQ(c->session_token, "env-token");
}

TEST_F(AwsCredentialsTest, TheProfileIsReadFromTheCredentialsFileThenTheConfigFile) {
  Write("credentials",
        "# comment\n[default]\naws_access_key_id=AKIDDEFAULT\naws_secret_access_key=d\n\n"
        "[ci]\n  aws_access_key_id = AKIDCI  \naws_secret_access_key = ci-secret\n");
  Write("config", "[profile other]\naws_access_key_id = AKIDOTHER\naws_secret_access_key = o\nregion = eu-west-3\n");
  ::setenv("AWS_SHARED_CREDENTIALS_FILE", dir_.File("credentials").c_str(), 1);
  ::setenv("AWS_CONFIG_FILE", dir_.File("config").c_str(), 1);
  auto def = FindCredentials({});
  ASSERT_OK(def);
  EXPECT_EQ(def->access_key_id, "AKIDDEFAULT");
  auto ci = FindCredentials({.profile = "ci"});
  ASSERT_OK(ci);
  EXPECT_EQ(ci->access_key_id, "AKIDCI");  // trimmed
  EXPECT_EQ(ci->secret_access_key, "ci-secret");
  ::setenv("AWS_PROFILE", "other", 1);  // found in the config file's "[profile other]"
  auto other = FindCredentials({});
  ASSERT_OK(other);
  EXPECT_EQ(other->access_key_id, "AKIDOTHER");
  auto region = FindRegion("", {});
  ASSERT_OK(region);
  EXPECT_EQ(*region, "eu-west-3");
}

TEST_F(AwsCredentialsTest, AKeyIdWithoutItsSecretIsNamedNeverPrinted) {
  Write("credentials", "[default]\naws_access_key_id = AKIDHALF\n");
  ::setenv("AWS_SHARED_CREDENTIALS_FILE", dir_.File("credentials").c_str(), 1);
  auto c = FindCredentials({});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kInvalidArgument);
  EXPECT_NE(c.status().message().find("no secret access key"), std::string::npos) << c.status();
  EXPECT_NE(c.status().message().find("[default]"), std::string::npos) << c.status();
}

TEST_F(AwsCredentialsTest, NoCredentialsAnywhereSaysWhereItLooked) {
  auto c = FindCredentials({.profile = "nobody"});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kNotFound);
  EXPECT_NE(c.status().message().find("AWS_ACCESS_KEY_ID"), std::string::npos) << c.status();
  EXPECT_NE(c.status().message().find(".aws/credentials"), std::string::npos) << c.status();
  EXPECT_NE(c.status().message().find("'nobody'"), std::string::npos) << c.status();
}

TEST_F(AwsCredentialsTest, TheRegionComesFromTheUrlThenTheEnvironmentAndIsChecked) {
  EXPECT_EQ(FindRegion("", {}).status().code(), Code::kNotFound);
  ::setenv("AWS_DEFAULT_REGION", "us-west-2", 1);
  EXPECT_EQ(*FindRegion("", {}), "us-west-2");
  ::setenv("AWS_REGION", "eu-central-1", 1);
  EXPECT_EQ(*FindRegion("", {}), "eu-central-1");
  EXPECT_EQ(*FindRegion("ap-south-1", {}), "ap-south-1");
  auto bad = FindRegion("US East 1", {});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("not a region name"), std::string::npos) << bad.status();
}

TEST_F(AwsCredentialsTest, ServiceErrorsMapToCodesThatSayWhatToDo) {
  EXPECT_EQ(ToStatus({.http_status = 400, .type = "ThrottlingException"}, "x").code(), Code::kBusy);
  EXPECT_EQ(ToStatus({.http_status = 400, .type = "ProvisionedThroughputExceededException"}, "x").code(), Code::kBusy);
  EXPECT_EQ(ToStatus({.http_status = 400, .type = "ResourceNotFoundException"}, "x").code(), Code::kNotFound);
  EXPECT_EQ(ToStatus({.http_status = 400, .type = "QueueDoesNotExist"}, "x").code(), Code::kNotFound);
  const Status refused = ToStatus({.http_status = 400, .type = "UnrecognizedClientException"}, "x");
  EXPECT_EQ(refused.code(), Code::kInvalidArgument);
  EXPECT_NE(refused.message().find("credentials were refused"), std::string::npos) << refused;
  EXPECT_EQ(ToStatus({.http_status = 503, .type = "ServiceUnavailable"}, "x").code(), Code::kUnavailable);
  EXPECT_TRUE(Retryable({.http_status = 400, .type = "ThrottlingException"}));
  EXPECT_TRUE(Retryable({.http_status = 500, .type = "InternalServerError"}));
  EXPECT_FALSE(Retryable({.http_status = 400, .type = "ConditionalCheckFailedException"}));
}

}  // namespace
}  // namespace idem::aws_internal
