// App Service Authentication on the Function app, for an Entra ID app registration: it validates
// Entra ID tokens and names their principal in X-MS-CLIENT-PRINCIPAL-ID (stripping a client's own
// copy). Requests without a token go on to the app, where function keys and the Personalizer
// routes' own keys are checked. Tokens count for the registration and for Azure AI services, the
// audience Personalizer clients ask for; the app admits only the principals its settings list.

@description('Name of the Function app.')
param functionAppName string

@description('Client id of the Entra ID app registration.')
param clientId string

resource site 'Microsoft.Web/sites@2024-04-01' existing = {
  name: functionAppName
}

// The checks skipped here are written for the 'web' config of an App Service web app; this
// config holds only the authentication settings.
resource authSettings 'Microsoft.Web/sites/config@2024-04-01' = {
  // checkov:skip=CKV_AZURE_13: this resource is App Service Authentication, in the V2 schema (platform.enabled), which the check does not read
  // checkov:skip=CKV_AZURE_63: App Service HTTP logs do not exist on Flex Consumption; requests and traces go to Application Insights
  // checkov:skip=CKV_AZURE_65: detailed error pages are an App Service web-server feature absent from Flex Consumption; errors go to Application Insights
  // checkov:skip=CKV_AZURE_66: failed request tracing is an IIS feature absent from Flex Consumption (Linux); failures go to Application Insights
  // checkov:skip=CKV_AZURE_80: a .NET Framework version applies to Windows web apps; this is a Python 3.11 app
  // checkov:skip=CKV_AZURE_88: Flex Consumption has no Azure Files content share; the package is read from blob storage with the managed identity
  // checkov:skip=CKV_AZURE_222: authentication settings have no network access property; see the site for why it is public
  parent: site
  name: 'authsettingsV2'
  properties: {
    platform: {
      enabled: true
    }
    globalValidation: {
      requireAuthentication: false
      unauthenticatedClientAction: 'AllowAnonymous'
    }
    httpSettings: {
      requireHttps: true
    }
    identityProviders: {
      azureActiveDirectory: {
        enabled: true
        registration: {
          clientId: clientId
          openIdIssuer: 'https://sts.windows.net/${tenant().tenantId}/'
        }
        validation: {
          allowedAudiences: [
            'api://${clientId}'
            clientId
            'https://cognitiveservices.azure.com'
          ]
        }
      }
    }
  }
}
